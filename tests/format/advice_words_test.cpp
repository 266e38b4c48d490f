// Advice in the words of whoever ran the loop, and batch rows whose data set
// row is unknown: the shared wording replay and the viewer print.
#include <gtest/gtest.h>

#include <string>

#include "nanscope/format/advice_words.hpp"
#include "nanscope/format/row_text.hpp"

using namespace nanscope::format;

TEST(AdviceWords, EachOriginSetsAnOptionTheWayItsUserDoes) {
  auto act_absmax = [](Origin o) { return how_to_set(o, advice_words(o).act_absmax_every); };
  EXPECT_EQ(act_absmax(Origin::nanscope_train), "train with --act-absmax-every N");
  EXPECT_EQ(act_absmax(Origin::cpp), "set GuardOptions::act_absmax_every = N");
  EXPECT_EQ(act_absmax(Origin::python), "use nanscope.GuardConfig(act_absmax_every=N)");
  // Files from before format 1.2 were all written by nanscope-train.
  EXPECT_EQ(act_absmax(Origin::unknown), act_absmax(Origin::nanscope_train));

  const std::vector<std::string> modules{"blocks.0.ln1", "head"};
  EXPECT_EQ(fp32_modules_setting(Origin::nanscope_train, modules), "--fp32-modules blocks.0.ln1,head");
  EXPECT_EQ(fp32_modules_setting(Origin::cpp, modules), "GuardOptions::fp32_modules = {\"blocks.0.ln1\", \"head\"}");
  EXPECT_EQ(fp32_modules_setting(Origin::python, modules),
            "nanscope.GuardConfig(fp32_modules=[\"blocks.0.ln1\", \"head\"])");
  EXPECT_EQ(std::string(advice_words(Origin::cpp).amp_bf16), "GuardOptions::amp = nanscope::Amp::bf16");
  EXPECT_EQ(std::string(advice_words(Origin::python).amp_bf16), "nanscope.StepGuard(..., amp=\"bf16\")");
}

TEST(AdviceWords, CodeIsLibTorchForCppLoopsAndTorchForPython) {
  for (Origin o : {Origin::nanscope_train, Origin::cpp, Origin::unknown}) {
    const AdviceWords& w = advice_words(o);
    EXPECT_EQ(std::string(w.log_softmax), "torch::log_softmax");
    EXPECT_EQ(std::string(w.cross_entropy), "torch::nn::functional::cross_entropy");
    EXPECT_EQ(std::string(w.check_finite).rfind("TORCH_CHECK(torch::isfinite(x).all().item<bool>()", 0), 0u);
  }
  const AdviceWords& py = advice_words(Origin::python);
  EXPECT_EQ(std::string(py.log_softmax), "torch.log_softmax");
  EXPECT_EQ(std::string(py.cross_entropy), "F.cross_entropy");
  EXPECT_EQ(std::string(py.logsumexp), "torch.logsumexp");
  EXPECT_EQ(std::string(py.check_finite).rfind("assert torch.isfinite(x).all()", 0), 0u);
}

TEST(RowText, AnUnknownDataSetRowIsNeitherMinusOneNorTheBatchPosition) {
  // A loop that gave no data set rows writes -1 for each.
  const std::vector<int64_t> batch_rows{120, -1, 97};
  EXPECT_EQ(dataset_row_text(batch_rows, 0), "data set row 120");
  EXPECT_EQ(dataset_row_text(batch_rows, 1), "data set row unknown");
  EXPECT_EQ(dataset_row_text(batch_rows, 3), "data set row unknown") << "past the batch";
  EXPECT_EQ(dataset_row_text({}, 2), "data set row unknown") << "no rows recorded";
  EXPECT_FALSE(dataset_row(batch_rows, 1));
  EXPECT_EQ(batch_rows_text(batch_rows, {1}), "batch row 1 (data set row unknown)");
  EXPECT_EQ(batch_rows_text(batch_rows, {0, 1, 2}),
            "batch rows 0 (data set row 120), 1 (data set row unknown), 2 (data set row 97)");
}
