//! The registry of model families: one line per family, mapping its name (transformers'
//! `model_type`) to the configuration type its module defines and that type's defaults.
//!
//! Everything a family is lives in its module (`qwen.rs`, `clip.rs`, …): its configuration
//! keys, its preprocessing and its token count, behind [`FamilyConfig`]. This module only names
//! them; the families never import it (they use [`super::value`] and [`super::family`]).

use super::clip::ClipConfig;
use super::error::ProcessorError;
use super::family::{FamilyConfig, VisionTokens};
use super::gemma3::Gemma3Config;
use super::idefics3::Idefics3Config;
use super::internvl::InternVlConfig;
use super::llama4::Llama4Config;
use super::llava_next::LlavaNextConfig;
use super::phi3v::Phi3VConfig;
use super::phi4::Phi4Config;
use super::pixtral::PixtralConfig;
use super::qwen::QwenConfig;
use super::value::{Common, Value};
use super::Outputs;

/// `Family` (the model families, by the names transformers' auto classes use) and
/// `ProcessorConfig` (a complete configuration of one family), from one line per family:
/// `Variant => "name", ConfigType = defaults;`.
macro_rules! registry {
    ($($family:ident => $name:literal, $config:ident = $defaults:expr;)+) => {
        /// The model families, by the names transformers' auto classes use.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum Family {
            $($family,)+
        }

        impl Family {
            pub const ALL: [Family; [$($name),+].len()] = [$(Family::$family,)+];

            pub fn name(self) -> &'static str {
                match self {
                    $(Family::$family => $name,)+
                }
            }
        }

        /// A complete configuration of one family.
        #[derive(Clone, Debug, PartialEq)]
        pub enum ProcessorConfig {
            $($family($config),)+
        }

        impl ProcessorConfig {
            /// The transformers class defaults of `family` (for the Qwen3 families, which share
            /// Qwen2-VL's class, the values of their published checkpoints: patch 16, mean/std
            /// 0.5, 65 536 … 16 777 216 pixels).
            pub fn defaults(family: Family) -> Self {
                match family {
                    $(Family::$family => ProcessorConfig::$family($defaults),)+
                }
            }

            pub fn family(&self) -> Family {
                match self {
                    $(ProcessorConfig::$family(_) => Family::$family,)+
                }
            }

            /// The family's configuration behind its trait.
            pub fn get(&self) -> &dyn FamilyConfig {
                match self {
                    $(ProcessorConfig::$family(c) => c,)+
                }
            }

            fn get_mut(&mut self) -> &mut dyn FamilyConfig {
                match self {
                    $(ProcessorConfig::$family(c) => c,)+
                }
            }
        }
    };
}

registry! {
    Qwen2Vl => "qwen2_vl", QwenConfig = QwenConfig::qwen2_vl();
    Qwen25Vl => "qwen2_5_vl", QwenConfig = QwenConfig::qwen2_vl();
    Qwen3Vl => "qwen3_vl", QwenConfig = QwenConfig::qwen3_vl();
    Qwen35 => "qwen3_5", QwenConfig = QwenConfig::qwen3_vl();
    Clip => "clip", ClipConfig = ClipConfig::clip();
    Llava => "llava", ClipConfig = ClipConfig::llava();
    Siglip => "siglip", ClipConfig = ClipConfig::siglip();
    LlavaNext => "llava_next", LlavaNextConfig = LlavaNextConfig::llava_next();
    Pixtral => "pixtral", PixtralConfig = PixtralConfig::pixtral();
    Gemma3 => "gemma3", Gemma3Config = Gemma3Config::gemma3();
    InternVl => "internvl", InternVlConfig = InternVlConfig::internvl();
    Idefics3 => "idefics3", Idefics3Config = Idefics3Config::idefics3();
    SmolVlm => "smolvlm", Idefics3Config = Idefics3Config::smolvlm();
    Llama4 => "llama4", Llama4Config = Llama4Config::llama4();
    Phi4Multimodal => "phi4_multimodal", Phi4Config = Phi4Config::phi4_multimodal();
    Phi3V => "phi3_v", Phi3VConfig = Phi3VConfig::phi3_v();
}

impl Family {
    pub fn from_name(name: &str) -> Option<Family> {
        Family::ALL.into_iter().find(|f| f.name() == name)
    }
}

impl ProcessorConfig {
    /// `family`'s defaults with `entries` applied in order, validated.
    pub fn build(family: Family, entries: &[(String, Value)]) -> Result<Self, ProcessorError> {
        let mut config = Self::defaults(family);
        for (key, value) in entries {
            config.set(key, value)?;
        }
        config.validate()?;
        Ok(config)
    }

    pub fn common(&self) -> &Common {
        self.get().common()
    }

    /// Sets one key.
    pub fn set(&mut self, key: &str, value: &Value) -> Result<(), ProcessorError> {
        let family = self.get_mut();
        if family.common_mut().set(key, value)? || family.set(key, value)? {
            Ok(())
        } else {
            Err(ProcessorError::Config {
                field: "key",
                expected: "a key of this family's configuration".to_owned(),
                actual: format!("{key:?}"),
            })
        }
    }

    /// Every key and its value.
    pub fn entries(&self) -> Vec<(&'static str, Value)> {
        let mut out = self.common().entries();
        out.extend(self.get().entries());
        out
    }

    pub fn validate(&self) -> Result<(), ProcessorError> {
        self.common().validate()?;
        self.get().validate()
    }

    /// Placeholder tokens per image of `outputs` (see [`FamilyConfig::image_tokens`]).
    pub fn image_tokens(
        &self,
        outputs: &Outputs,
        vision: Option<&VisionTokens>,
    ) -> Option<Vec<i64>> {
        self.get().image_tokens(outputs, vision)
    }

    /// Placeholder tokens per video of `outputs`.
    pub fn video_tokens(&self, outputs: &Outputs) -> Option<Vec<i64>> {
        self.get().video_tokens(outputs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, i64)]) -> Value {
        Value::Map(pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect())
    }

    #[test]
    fn families_round_trip() {
        for family in Family::ALL {
            assert_eq!(Family::from_name(family.name()), Some(family));
            let config = ProcessorConfig::defaults(family);
            config.validate().unwrap();
            // Every entry can be set back.
            let entries: Vec<(String, Value)> = config
                .entries()
                .into_iter()
                .map(|(k, v)| (k.to_owned(), v))
                .collect();
            assert_eq!(ProcessorConfig::build(family, &entries).unwrap(), config);
        }
        assert_eq!(Family::from_name("gemma"), None);
    }

    #[test]
    fn bad_values() {
        let build = |k: &str, v: Value| {
            ProcessorConfig::build(Family::Clip, &[(k.to_owned(), v)]).unwrap_err()
        };
        assert!(build("resample", Value::Int(9))
            .to_string()
            .contains("resample"));
        assert!(build("image_mean", Value::Floats(vec![0.5; 2]))
            .to_string()
            .contains("image_mean"));
        assert!(build("size", map(&[("height", 2)]))
            .to_string()
            .contains("keys"));
        assert!(build("size", map(&[("shortest_edge", 0)]))
            .to_string()
            .contains("between"));
        assert!(build("crop_size", map(&[("shortest_edge", 5)]))
            .to_string()
            .contains("height and width"));
        assert!(build("patch_size", Value::Int(14))
            .to_string()
            .contains("key"));
        assert_eq!(
            build("rescale_factor", Value::Float(f64::NAN)).kind(),
            "config"
        );
    }
}
