//! The registry of model families: one line per family, mapping its name (transformers'
//! `model_type`) to the configuration type its module defines and that type's defaults.
//!
//! Everything a family is lives in its module (`qwen.rs`, `clip.rs`, …): its configuration
//! keys, its preprocessing and its token count, behind [`FamilyConfig`]. This module only names
//! them; the families never import it (they use [`super::value`] and [`super::family`]).

use super::clip::{self, ClipConfig};
use super::error::ProcessorError;
use super::family::{FamilyConfig, Hf, VisionTokens};
use super::gemma3::{self, Gemma3Config};
use super::gemma4::{self, Gemma4Config};
use super::gemma4_unified::{self, Gemma4UnifiedConfig};
use super::glm::{self, GlmConfig};
use super::idefics3::{self, Idefics3Config};
use super::inkling::{self, Inkling2Config, InklingConfig};
use super::internvl::{self, InternVlConfig};
use super::kimi::{self, KimiConfig};
use super::llama4::{self, Llama4Config};
use super::llava_next::{self, LlavaNextConfig};
use super::minimax::{self, MiniMaxConfig};
use super::mllama::{self, MllamaConfig};
use super::nemotron::{self, NemotronConfig};
use super::phi3v::{self, Phi3VConfig};
use super::phi4::{self, Phi4Config};
use super::pixtral::{self, PixtralConfig};
use super::qwen::{self, QwenConfig};
use super::siglip;
use super::value::{Common, Value};
use super::Outputs;

/// `Family` (the model families, by the names transformers' auto classes use) and
/// `ProcessorConfig` (a complete configuration of one family), from one line per family:
/// `Variant => "name", ConfigType = defaults, module::HF;` (its [`Hf`]: the transformers classes
/// that name it and how its `preprocessor_config.json` reads).
macro_rules! registry {
    ($($family:ident => $name:literal, $config:ident = $defaults:expr, $hf:path;)+) => {
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

            /// The family's transformers classes and key normalisation.
            pub fn hf(self) -> &'static Hf {
                match self {
                    $(Family::$family => &$hf,)+
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
    Qwen2Vl => "qwen2_vl", QwenConfig = QwenConfig::qwen2_vl(), qwen::QWEN2_VL;
    Qwen25Vl => "qwen2_5_vl", QwenConfig = QwenConfig::qwen2_vl(), qwen::QWEN2_5_VL;
    Qwen3Vl => "qwen3_vl", QwenConfig = QwenConfig::qwen3_vl(), qwen::QWEN3_VL;
    Qwen35 => "qwen3_5", QwenConfig = QwenConfig::qwen3_vl(), qwen::QWEN3_5;
    Qwen3OmniMoe => "qwen3_omni_moe", QwenConfig = QwenConfig::qwen3_omni(), qwen::QWEN3_OMNI_MOE;
    Clip => "clip", ClipConfig = ClipConfig::clip(), clip::CLIP;
    Llava => "llava", ClipConfig = ClipConfig::llava(), clip::LLAVA;
    Siglip => "siglip", ClipConfig = ClipConfig::siglip(), siglip::SIGLIP;
    LlavaNext => "llava_next", LlavaNextConfig = LlavaNextConfig::llava_next(), llava_next::LLAVA_NEXT;
    Pixtral => "pixtral", PixtralConfig = PixtralConfig::pixtral(), pixtral::PIXTRAL;
    Gemma3 => "gemma3", Gemma3Config = Gemma3Config::gemma3(), gemma3::GEMMA3;
    InternVl => "internvl", InternVlConfig = InternVlConfig::internvl(), internvl::INTERNVL;
    Idefics3 => "idefics3", Idefics3Config = Idefics3Config::idefics3(), idefics3::IDEFICS3;
    SmolVlm => "smolvlm", Idefics3Config = Idefics3Config::smolvlm(), idefics3::SMOLVLM;
    Llama4 => "llama4", Llama4Config = Llama4Config::llama4(), llama4::LLAMA4;
    Phi4Multimodal => "phi4_multimodal", Phi4Config = Phi4Config::phi4_multimodal(), phi4::PHI4_MULTIMODAL;
    Phi3V => "phi3_v", Phi3VConfig = Phi3VConfig::phi3_v(), phi3v::PHI3_V;
    Mllama => "mllama", MllamaConfig = MllamaConfig::mllama(), mllama::MLLAMA;
    Gemma4 => "gemma4", Gemma4Config = Gemma4Config::gemma4(), gemma4::GEMMA4;
    Gemma4Unified => "gemma4_unified", Gemma4UnifiedConfig = Gemma4UnifiedConfig::gemma4_unified(), gemma4_unified::GEMMA4_UNIFIED;
    Glm4v => "glm4v", GlmConfig = GlmConfig::glm4v(), glm::GLM4V;
    Glm46v => "glm46v", GlmConfig = GlmConfig::glm4v(), glm::GLM46V;
    Glm5Next => "glm5_next", GlmConfig = GlmConfig::glm5_next(), glm::GLM5_NEXT;
    MinimaxM3Vl => "minimax_m3_vl", MiniMaxConfig = MiniMaxConfig::minimax_m3_vl(), minimax::MINIMAX_M3_VL;
    Inkling => "inkling", InklingConfig = InklingConfig::inkling(), inkling::INKLING;
    Inkling2 => "inkling2", Inkling2Config = Inkling2Config::inkling2(), inkling::INKLING2;
    KimiK25 => "kimi_k25", KimiConfig = KimiConfig::kimi_k25(), kimi::KIMI_K25;
    NemotronHOmni => "nemotron_h_omni", NemotronConfig = NemotronConfig::nemotron_h_omni(), nemotron::NEMOTRON_H_OMNI;
}

/// The families' `model_type` aliases, one table per module that has them.
const MODEL_TYPES: &[&[(&str, &str)]] = &[
    qwen::MODEL_TYPES,
    glm::MODEL_TYPES,
    gemma4_unified::MODEL_TYPES,
    minimax::MODEL_TYPES,
    inkling::MODEL_TYPES,
    kimi::MODEL_TYPES,
    nemotron::MODEL_TYPES,
];
/// The processor classes that name a family, likewise.
const PROCESSOR_CLASSES: &[&[(&str, &str)]] = &[qwen::PROCESSOR_CLASSES];

impl Family {
    pub fn from_name(name: &str) -> Option<Family> {
        Family::ALL.into_iter().find(|f| f.name() == name)
    }

    /// The family a `config.json` `model_type` names, where its module lists the model type
    /// (Qwen: `qwen3_vl`, `qwen3_5_moe`, `qwen4_exp`, `qwen3_omni_moe`, …). A family whose
    /// image processor class names it unambiguously lists none.
    pub fn from_model_type(model_type: &str) -> Option<Family> {
        MODEL_TYPES
            .iter()
            .flat_map(|table| table.iter())
            .find(|(alias, _)| *alias == model_type)
            .and_then(|(_, name)| Family::from_name(name))
    }

    /// The family a transformers processor class (`processor_class`) names over its image
    /// processor class, where a module lists one (Qwen3-Omni's `Qwen3OmniMoeProcessor`).
    pub fn from_processor_class(class: &str) -> Option<Family> {
        PROCESSOR_CLASSES
            .iter()
            .flat_map(|table| table.iter())
            .find(|(name, _)| *name == class)
            .and_then(|(_, family)| Family::from_name(family))
    }

    /// The family a transformers image or video processor class names (without the
    /// `Fast`/`Pil` suffix).
    pub fn from_class(class: &str) -> Option<Family> {
        Family::ALL.into_iter().find(|f| {
            let hf = f.hf();
            hf.image_classes.contains(&class) || hf.video_classes.contains(&class)
        })
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

    /// Every structured replacement rule is consistent: its anchor and embed tokens are among its
    /// tokens and have exactly one published default id, every default names one of its tokens
    /// (a text piece may have several ids, in order), flat tensors have a sizes tensor, and its
    /// joins are distinct text pieces with their ids.
    /// Tokens without a default (text only the model's tokenizer knows, such as Gemma 3's
    /// pan-and-scan sentence) are read from the model directory.
    #[test]
    fn replacement_specs_are_consistent() {
        for family in Family::ALL {
            let config = ProcessorConfig::defaults(family);
            let Some(spec) = config.get().replacement_spec() else {
                continue;
            };
            let name = family.name();
            assert!(!spec.grid.is_empty(), "{name}: no grid tensor");
            for token in [spec.anchor, spec.embed] {
                assert!(
                    spec.tokens.contains(&token),
                    "{name}: {token} not in tokens"
                );
                let ids = spec.defaults.iter().filter(|(t, _)| *t == token).count();
                assert_eq!(ids, 1, "{name}: default id of {token}");
            }
            for (token, _) in spec.defaults {
                assert!(
                    spec.tokens.contains(token) || spec.joins.contains(token),
                    "{name}: default for unknown {token:?}"
                );
            }
            let mut names: Vec<&str> = spec.tokens.to_vec();
            names.sort_unstable();
            names.dedup();
            assert_eq!(
                names.len(),
                spec.tokens.len(),
                "{name}: a token named twice"
            );
            assert_eq!(spec.flat.is_empty(), spec.sizes.is_empty(), "{name}: sizes");
            // joins: distinct non-empty text pieces, never the anchor or embed token, each
            // with at most one default id; a replacement edge piece that joins has its id
            for (i, join) in spec.joins.iter().enumerate() {
                assert!(!join.is_empty(), "{name}: empty join piece");
                assert!(
                    !spec.joins[..i].contains(join),
                    "{name}: join {join:?} twice"
                );
                assert!(
                    *join != spec.anchor && *join != spec.embed,
                    "{name}: join {join:?}"
                );
                let ids = spec.defaults.iter().filter(|(t, _)| t == join).count();
                assert!(ids <= 1, "{name}: default ids of join {join:?}");
                if spec.tokens.contains(join) {
                    assert_eq!(ids, 1, "{name}: default id of join {join:?}");
                }
            }
        }
    }

    /// Every family has published token ids: a run family in its `Hf::published`, a family
    /// with a structured replacement in its spec's defaults — never both, never neither.
    #[test]
    fn every_family_publishes_its_token_ids() {
        for family in Family::ALL {
            let spec = ProcessorConfig::defaults(family).get().replacement_spec();
            let published = family.hf().published;
            assert!(
                spec.is_some() != published.is_some(),
                "{}: published ids in exactly one place",
                family.name()
            );
        }
    }

    #[test]
    fn classes_name_one_family() {
        use super::super::value::Raw;
        assert_eq!(
            Family::from_class("Qwen2VLImageProcessor"),
            Some(Family::Qwen2Vl)
        );
        assert_eq!(
            Family::from_class("Qwen3VLVideoProcessor"),
            Some(Family::Qwen3Vl)
        );
        assert_eq!(Family::from_class("Qwen2VLImageProcessorFast"), None);
        let mut seen = Vec::new();
        for family in Family::ALL {
            let hf = family.hf();
            for class in hf.image_classes.iter().chain(hf.video_classes) {
                assert!(!seen.contains(class), "{class}");
                assert_eq!(Family::from_class(class), Some(family));
                seen.push(class);
            }
            // Every family reads `image_mean` (as floats) and drops unknown keys.
            let config: Vec<(String, Raw)> = vec![
                ("image_mean".into(), Raw::List(vec![Raw::Int(1); 3])),
                ("unknown".into(), Raw::Int(1)),
            ];
            let floats = Raw::List(vec![Raw::Float(1.0); 3]);
            let out = (hf.normalise)(&config).unwrap();
            assert_eq!(
                out,
                vec![("image_mean".into(), floats)],
                "{}",
                family.name()
            );
        }
    }

    #[test]
    fn qwen_partial_sizes() {
        use super::super::value::Raw;
        let read = |family: Family, config: Vec<(&str, Raw)>| {
            let config: Vec<(String, Raw)> =
                config.into_iter().map(|(k, v)| (k.to_owned(), v)).collect();
            (family.hf().normalise)(&config).unwrap()
        };
        let size = |s: i64, l: i64| {
            vec![(
                "size".to_owned(),
                Raw::Map(vec![
                    ("shortest_edge".into(), Raw::Int(s)),
                    ("longest_edge".into(), Raw::Int(l)),
                ]),
            )]
        };
        assert_eq!(
            read(Family::Qwen2Vl, vec![("min_pixels", Raw::Int(7))]),
            size(7, 28 * 28 * 1280)
        );
        assert_eq!(
            read(Family::Qwen35, vec![("max_pixels", Raw::Int(9))]),
            size(65_536, 9)
        );
        assert_eq!(
            read(
                Family::Qwen3Vl,
                vec![("size", Raw::Int(5)), ("max_pixels", Raw::Int(9))]
            ),
            size(5, 9)
        );
        assert_eq!(
            read(Family::Qwen3Vl, vec![("size", Raw::Map(vec![]))]),
            vec![("size".to_owned(), Raw::Map(vec![]))]
        );
        let bad = vec![("size".to_owned(), Raw::Str("x".into()))];
        assert!((Family::Clip.hf().normalise)(&bad).is_err());
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
