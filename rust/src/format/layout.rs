//! The canonical layout string of a file's sections (what a server must match to restore it).
//!
//! CONTRACT: one entry per body section, joined by `+`, the recurrent section last (`rec[...]`, see `recurrent.rs`):
//! * `kv[-]`: a section with no cells (an empty slot writes only `n_stream` and zero counts, so nothing else
//!   about the cache is known). An empty slot file is therefore `kv[-]` (one section) or `kv[-]+kv[-]` (iSWA).
//! * `kv[<n_layer>:<layers>;vt<v_trans>;rot<n_rot_k>,<n_rot_v>;ext<0|1>]` where `<layers>` lists each layer as
//!   `<K type>/<K row bytes>,<V type>/<V row bytes>` (transposed V: `<V type>/<el>x<n_embd>`), consecutive equal
//!   layers collapsed to `<layer>*<count>`, joined by `|`. Types are ggml names (`f16`, `q8_0`, ...) or `t<id>`.
//!
//! Not part of the layout: token count, positions, slot id (seq_id), `n_stream` and the stream index, the
//! checkpoint appendix (all depend on history or on the caller, and the store records them separately).

use super::model::*;

pub(crate) fn ggml_type_name(t: i32) -> String {
    let name = match t {
        0 => "f32",
        1 => "f16",
        2 => "q4_0",
        3 => "q4_1",
        6 => "q5_0",
        7 => "q5_1",
        8 => "q8_0",
        9 => "q8_1",
        20 => "iq4_nl",
        30 => "bf16",
        _ => return format!("t{t}"),
    };
    name.to_string()
}

fn layer_desc(l: &LayerHdr) -> String {
    let v = match l.v {
        VLayout::Rows { ty, row } => format!("{}/{}", ggml_type_name(ty), row),
        VLayout::Trans { ty, el, n_embd } => format!("{}/{}x{}", ggml_type_name(ty), el, n_embd),
    };
    format!("{}/{},{}", ggml_type_name(l.k_ty), l.k_row, v)
}

fn section_desc(s: &Section<'_>) -> String {
    let Some(c) = &s.cells else { return "kv[-]".to_string() };
    let mut runs: Vec<(String, usize)> = Vec::new();
    for l in &c.layers {
        let d = layer_desc(l);
        match runs.last_mut() {
            Some((p, n)) if *p == d => *n += 1,
            _ => runs.push((d, 1)),
        }
    }
    let layers: Vec<String> =
        runs.into_iter().map(|(d, n)| if n == 1 { d } else { format!("{d}*{n}") }).collect();
    format!(
        "kv[{}:{};vt{};rot{},{};ext{}]",
        c.layers.len(),
        layers.join("|"),
        c.v_trans,
        c.n_rot_k,
        c.n_rot_v,
        s.cell_ext as u8
    )
}

pub(crate) fn layout(sections: &[Section<'_>], recurrent: Option<&Recurrent<'_>>) -> String {
    sections.iter().map(section_desc).chain(recurrent.map(|r| r.layout())).collect::<Vec<_>>().join("+")
}
