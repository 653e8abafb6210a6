//! SigLIP (`SiglipImageProcessorPil`): resize straight to `size` (224 × 224 by default, 384 × 384
//! in many checkpoints) with BICUBIC, no crop, rescale, normalize with mean = std = 0.5 →
//! `pixel_values` `(B, 3, H, W)` float32.
//!
//! It is the generic `PilBackend` pipeline of [`super::clip`] with these defaults.

use super::clip::{ClipConfig, PadMode, CLIP_KEYS};
use super::family::{Hf, Published, VisionTokens};
use super::sizes::SizeSpec;
use super::value::{hf_clip_like, hf_pad_size, Common, HALF};

/// SigLIP: `SiglipImageProcessor` (CLIP's keys and `pad_size`).
pub const SIGLIP: Hf = Hf {
    image_classes: &["SiglipImageProcessor"],
    video_classes: &[],
    normalise: |config| {
        let mut out = hf_clip_like(config, &CLIP_KEYS, false)?;
        hf_pad_size(config, &mut out)?;
        Ok(out)
    },
    processor_keys: &[],
    processor_forces: None,
    // SigLIP's canonical VLM is PaliGemma (google/paligemma-3b-pt-224: SiglipImageProcessor,
    // config.json image_token_index 257152, the tokenizer's <image>); SigLIP So400m/14 has no
    // CLS token, every patch is a token (256 at 224 px).
    published: Some(Published {
        image: 257152,
        video: None,
        vision_tokens: Some(VisionTokens {
            patch_size: 14,
            num_additional_image_tokens: 0,
            drop_one: false,
        }),
    }),
    count_tensor: None,
};

impl ClipConfig {
    /// `SiglipImageProcessorPil`'s class defaults.
    pub fn siglip() -> Self {
        ClipConfig {
            common: Common::new(HALF, HALF),
            size: SizeSpec::Exact {
                height: 224,
                width: 224,
            },
            do_center_crop: false,
            crop_size: None,
            pad_mode: PadMode::Batch,
            do_pad: false,
            pad_size: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::processors::{Family, Input, Options, Preprocessor, TensorData, Value};

    #[test]
    fn fixed_size_and_half_normalisation() {
        let data = vec![255u8; 7 * 5 * 3];
        let input = Input::Pixels {
            data: &data,
            width: 5,
            height: 7,
            channels: 3,
        };
        let size = Value::Map(vec![("height".into(), 3), ("width".into(), 4)]);
        let p = Preprocessor::new(Family::Siglip, &[("size".into(), size)]).unwrap();
        let out = p.images(&[input], &Options::default()).unwrap();
        let pv = out.get("pixel_values").unwrap();
        assert_eq!(pv.shape, [1, 3, 3, 4]);
        // A constant image stays constant through bicubic; 255 -> (1.0 - 0.5) / 0.5 = 1.0.
        assert_eq!(pv.data, TensorData::F32(vec![1.0; 36]));
    }
}
