//! Where each cell of a KV section goes, as runs of cells that move together.
//!
//! CONTRACT: block `k` holds the cells with `pos` in `[k*B, (k+1)*B)`, sorted by position. The mapping is
//! expressed as runs of consecutive file cells that land on consecutive rows of one block, so both directions
//! (cut and emit) copy whole runs at once.

/// `len` file cells starting at file index `file` are rows `row..row+len` of block `block` (section-local).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Run {
    pub file: usize,
    pub len: usize,
    pub block: usize,
    pub row: usize,
}

/// The blocks of one `model::Unit`: KV cells by position, or a recurrent section's 0 or 1 whole block.
#[derive(Debug)]
pub(crate) enum UnitPlan {
    Kv(Plan),
    Rec(usize),
}

impl UnitPlan {
    pub fn n_blocks(&self) -> usize {
        match self {
            UnitPlan::Kv(p) => p.block_cells.len(),
            UnitPlan::Rec(n) => *n,
        }
    }
}

#[derive(Debug)]
pub(crate) struct Plan {
    /// Number of cells in each block, in block (= position) order.
    pub block_cells: Vec<usize>,
    /// In file order; together they cover every cell exactly once.
    pub runs: Vec<Run>,
}

/// Fails with the duplicated position.
pub(crate) fn plan(pos: &[i32], block_size: u32) -> Result<Plan, i32> {
    let bs = i64::from(block_size.max(1));
    let key = |p: i32| i64::from(p).div_euclid(bs);
    let mut order: Vec<u32> = (0..pos.len() as u32).collect();
    // Usually already sorted (non-SWA) or two sorted runs (SWA ring): cheap for the stable sort.
    order.sort_by_key(|&i| pos[i as usize]);
    let mut slot = vec![(0u32, 0u32); pos.len()]; // file index -> (block, row)
    let mut block_cells: Vec<usize> = Vec::new();
    let mut prev: Option<i32> = None;
    for &i in &order {
        let p = pos[i as usize];
        match prev {
            Some(q) if q == p => return Err(p),
            Some(q) if key(q) == key(p) => *block_cells.last_mut().expect("block open") += 1,
            _ => block_cells.push(1),
        }
        prev = Some(p);
        slot[i as usize] = ((block_cells.len() - 1) as u32, (block_cells.last().copied().unwrap_or(1) - 1) as u32);
    }
    let mut runs: Vec<Run> = Vec::new();
    for (i, &(b, row)) in slot.iter().enumerate() {
        let (b, row) = (b as usize, row as usize);
        match runs.last_mut() {
            Some(r) if r.block == b && r.row + r.len == row => r.len += 1,
            _ => runs.push(Run { file: i, len: 1, block: b, row }),
        }
    }
    Ok(Plan { block_cells, runs })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sorted_positions_are_one_run_per_block() {
        let pos: Vec<i32> = (0..10).collect();
        let p = plan(&pos, 4).unwrap();
        assert_eq!(p.block_cells, vec![4, 4, 2]);
        assert_eq!(p.runs.len(), 3);
        assert_eq!(p.runs[1], Run { file: 4, len: 4, block: 1, row: 0 });
    }

    #[test]
    fn ring_order_and_duplicates() {
        // 8..11 then 5..7: the block [4,8) holds 5,6,7 (rows 0..3), [8,12) holds 8..11.
        let pos = [8, 9, 10, 11, 5, 6, 7];
        let p = plan(&pos, 4).unwrap();
        assert_eq!(p.block_cells, vec![3, 4]);
        assert_eq!(p.runs, vec![Run { file: 0, len: 4, block: 1, row: 0 }, Run { file: 4, len: 3, block: 0, row: 0 }]);
        assert_eq!(plan(&[1, 2, 1], 4).unwrap_err(), 1);
        // reversed order: one run per cell
        let p = plan(&[3, 2, 1, 0], 4).unwrap();
        assert_eq!(p.runs.len(), 4);
        assert_eq!(p.runs[0], Run { file: 0, len: 1, block: 0, row: 3 });
        // negative positions go to negative block keys, still ordered
        assert_eq!(plan(&[-1, 0], 4).unwrap().block_cells, vec![1, 1]);
    }
}
