// The flat batch a backend receives: slots, the dense block table, runs of
// consecutive tokens, a fixed table width (graphs), and errors for
// positions without a block.
#include <gtest/gtest.h>

#include "backend/batch.h"

namespace wick::test {
namespace {

TEST(Batch, FinishDerivesSlotsTableAndRuns) {
  Batch b;
  b.block_tables = {{7, 2}, {5}};
  // sequence 0 at 14..17 (crosses a block), interleaved with sequence 1 at 3
  b.add(10, 14, 0, false);
  b.add(11, 15, 0, false);
  b.add(20, 3, 1, true);
  b.add(12, 16, 0, false);
  b.add(13, 17, 0, true);
  b.finish(16);
  const BatchArgs a = b.args(b.packed().data());
  EXPECT_EQ(a.n_tokens, 5);
  EXPECT_EQ(a.n_seqs, 2);
  EXPECT_EQ(a.n_logits, 2);
  EXPECT_EQ(a.max_blocks, 2);
  EXPECT_EQ(a.max_ctx, 18);
  const std::vector<int32_t> slots(a.slots, a.slots + 5);
  EXPECT_EQ(slots,
            (std::vector<int32_t>{7 * 16 + 14, 7 * 16 + 15, 5 * 16 + 3, 2 * 16 + 0, 2 * 16 + 1}));
  const std::vector<int32_t> table(a.block_table, a.block_table + 4);
  EXPECT_EQ(table, (std::vector<int32_t>{7, 2, 5, -1}));
  // runs: [0, 2) of seq 0, [2, 3) of seq 1, [3, 5) of seq 0
  EXPECT_EQ(a.n_runs, 3);
  const std::vector<int32_t> runs(a.runs, a.runs + 6);
  EXPECT_EQ(runs, (std::vector<int32_t>{0, 2, 2, 1, 3, 2}));
  EXPECT_EQ(a.max_run, 2);
  const std::vector<int32_t> rows(a.logit_rows, a.logit_rows + 2);
  EXPECT_EQ(rows, (std::vector<int32_t>{2, 4}));
}

TEST(Batch, FixedWidthKeepsTheLayoutAndRoundsTheContext) {
  Batch b;
  b.block_tables = {{1}, {3, 4}};
  b.add(1, 5, 0, true);
  b.add(2, 20, 1, true);
  b.finish(16, 8, 512);
  const BatchArgs a = b.args(b.packed().data());
  EXPECT_EQ(a.max_blocks, 8);
  EXPECT_EQ(a.max_ctx, 128);  // min(8 * 16, round_up(21, 512))
  b.finish(16, 8);
  EXPECT_EQ(b.args(b.packed().data()).max_ctx, 128);  // the capacity
  // the same counts give the same packed size, whatever the tables hold
  const size_t size = b.packed().size();
  b.block_tables = {{9}, {3, 4, 6}};
  b.finish(16, 8);
  EXPECT_EQ(b.packed().size(), size);
  b.block_tables[1].resize(9);
  EXPECT_THROW(b.finish(16, 8), std::invalid_argument);  // longer than the width
}

TEST(Batch, BadBatchesAreErrors) {
  Batch b;
  b.block_tables = {{0}};
  b.add(1, 16, 0, false);  // past the one block
  EXPECT_THROW(b.finish(16), std::invalid_argument);
  Batch c;
  c.block_tables = {{0}};
  c.add(1, 0, 1, false);  // no sequence 1
  EXPECT_THROW(c.finish(16), std::invalid_argument);
  Batch d;
  EXPECT_THROW(d.args(nullptr), std::logic_error);  // not finished
}

}  // namespace
}  // namespace wick::test
