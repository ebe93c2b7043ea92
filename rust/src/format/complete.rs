//! Whether a slot file holds every section its model implies: a file cut at a section boundary still parses.
//!
//! CONTRACT: `Shape::of` records a parsed file's KV sections (the layers each holds, none for a section without
//! cells) and whether a recurrent section follows; `Shape::check` compares it with what the model's GGUF says
//! (`n_layer` = `<arch>.block_count`; `n_swa` = its sliding window, 0 without one):
//! * an attention-only SWA model (n_swa > 0) is saved by `llama_kv_cache_iswa`: two KV sections, the non-SWA
//!   layers then the SWA layers, both holding cells (a non-empty state has cells in its window);
//! * an attention-only model without a window writes one KV section;
//! * the layers of the KV sections add up to at most `n_layer`: fewer is allowed, because some architectures give
//!   a layer no cache of its own (Gemma 3n's layers that share another's KV, GLM's next-token-prediction layers),
//!   and refusing those would refuse every save of such a model; a file of another model's sections is caught by
//!   the section rules above and by the namespace's recorded layout (`store/ingest.rs`).
//!
//! A file with a recurrent section (recurrent and hybrid models) is checked only for `n_swa`; its layer split
//! between attention and recurrent layers is not in the GGUF keys read here. Not checkable at all: a file cut
//! just before its `SCKP` appendix is byte for byte what a server run with `--ctx-checkpoints 0` writes (and
//! llama-server loads it), so it is accepted.

use super::model::SlotFile;
use super::FormatError;

/// The sections of a parsed file, as far as completeness is concerned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shape {
    /// Per KV section in file order: the layers it holds, `None` for a section without cells.
    pub kv_layers: Vec<Option<u32>>,
    pub recurrent: bool,
}

/// What the model's hyperparameters say a whole file holds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ModelShape {
    /// `<arch>.block_count`, when known.
    pub n_layer: Option<u32>,
    /// The sliding window; 0 for a model without SWA layers; `None` when not known.
    pub n_swa: Option<u32>,
}

impl Shape {
    pub(crate) fn of(f: &SlotFile<'_>) -> Shape {
        Shape {
            kv_layers: f.sections.iter().map(|s| s.cells.as_ref().map(|c| c.layers.len() as u32)).collect(),
            recurrent: f.recurrent.is_some(),
        }
    }

    fn describe(&self) -> String {
        let layers: Vec<String> =
            self.kv_layers.iter().map(|l| l.map_or("no cells".to_string(), |n| format!("{n} layers"))).collect();
        let n = self.kv_layers.len();
        let rec = if self.recurrent { " and a recurrent section" } else { "" };
        format!("{n} KV section{} ({}){rec}", if n == 1 { "" } else { "s" }, layers.join(", "))
    }

    /// `Ok` if the file can be whole for this model; else `FormatError::Incomplete` saying what is missing.
    pub fn check(&self, model: &ModelShape) -> Result<(), FormatError> {
        let incomplete = |want: String| FormatError::Incomplete { want, found: self.describe() };
        let swa = model.n_swa.map(|w| w > 0);
        if swa == Some(true) && !self.recurrent {
            let both = self.kv_layers.len() == 2 && self.kv_layers.iter().all(Option::is_some);
            if !both {
                return Err(incomplete(format!(
                    "a sliding-window model (n_swa {}) saves two KV sections, its global and its SWA layers, both \
                     holding cells",
                    model.n_swa.unwrap_or(0)
                )));
            }
        }
        if swa == Some(false) && !self.recurrent && self.kv_layers.len() != 1 {
            return Err(incomplete("a model without a sliding window saves one KV section".into()));
        }
        if let (Some(n_layer), false) = (model.n_layer, self.recurrent) {
            let held: u32 = self.kv_layers.iter().flatten().sum();
            if held > n_layer {
                return Err(incomplete(format!("the model has {n_layer} layers, the file's sections hold {held}")));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(kv: &[Option<u32>], recurrent: bool) -> Shape {
        Shape { kv_layers: kv.to_vec(), recurrent }
    }

    #[test]
    fn an_swa_model_needs_both_sections_with_every_layer() {
        let gemma = ModelShape { n_layer: Some(18), n_swa: Some(512) };
        shape(&[Some(3), Some(15)], false).check(&gemma).unwrap();
        let cut = shape(&[Some(3)], false).check(&gemma).unwrap_err().to_string();
        assert!(cut.contains("two KV sections") && cut.contains("1 KV section (3 layers)"), "{cut}");
        assert!(shape(&[Some(3), None], false).check(&gemma).is_err());
        let other = shape(&[Some(5), Some(25)], false).check(&gemma).unwrap_err().to_string();
        assert!(other.contains("18 layers") && other.contains("hold 30"), "{other}");
        // Fewer layers than the model has: layers without a cache of their own (KV shared with another layer).
        shape(&[Some(3), Some(12)], false).check(&gemma).unwrap();
    }

    #[test]
    fn a_plain_model_needs_one_section_and_unknowns_check_nothing() {
        let smol = ModelShape { n_layer: Some(30), n_swa: Some(0) };
        shape(&[Some(30)], false).check(&smol).unwrap();
        assert!(shape(&[Some(3), Some(15)], false).check(&smol).is_err());
        assert!(shape(&[Some(31)], false).check(&smol).is_err());
        shape(&[Some(3)], false).check(&ModelShape::default()).unwrap();
        // A recurrent file: the layer split is not checked, the window rule is not applied to it.
        shape(&[Some(2)], true).check(&ModelShape { n_layer: Some(6), n_swa: Some(0) }).unwrap();
    }
}
