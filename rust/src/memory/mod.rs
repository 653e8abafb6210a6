//! Large buffers: how they are backed and reused.
//!
//! - [`huge_pages`]: advice to back fresh buffers of several MB with transparent huge pages
//!   (one page fault per 2 MiB instead of per 4 KiB);
//! - [`recycle`]: a bounded cache of large buffers handed back after use (output tensors Python
//!   dropped, intermediate images), so the next call writes into memory that is already mapped.
//!
//! Used by the tensor codec, the image decoders and the model processors; neither changes a
//! single output byte.

pub mod huge_pages;
pub mod recycle;

pub use huge_pages::advise_huge_pages;
