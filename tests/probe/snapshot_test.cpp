// Snapshots: read back whole; and a snapshot that cannot be written never
// stops training.
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <fstream>
#include <limits>

#include "../support/test_support.hpp"

#include "nanscope/format/error.hpp"
#include "nanscope/format/run_file.hpp"
#include "nanscope/probe/activation_recorder.hpp"
#include "nanscope/probe/snapshot.hpp"

using namespace nanscope;

TEST(Snapshot, RoundTripsEveryPart) {
  test::TempDir dir;
  probe::SnapshotContents s;
  s.step = 42;
  s.model_name = "gpt";
  s.model_hparams = {{"n_layer", 2}, {"n_embd", 64}};
  s.torchscript_bytes = std::string("\0PK\x03", 4);
  s.parameters = {{"blocks.0.attn.qkv.weight", at::randn({3, 4})}, {"head.bias", at::randn({5})}};
  s.buffers = {{"norm.running_mean", at::zeros({4})}};
  s.optimizer = "adamw";
  s.optimizer_state = {{"head.bias/exp_avg", at::randn({5})}, {"head.bias/step", at::full({}, 7, at::kLong)}};
  s.batch.inputs = at::randint(0, 256, {2, 8}, at::kLong);
  s.batch.targets = at::randint(0, 256, {2, 8}, at::kLong);
  s.batch_rows = at::tensor({int64_t(5), int64_t(9)});
  static_cast<void>(at::rand({3}));
  s.cpu_rng_state = at::detail::getDefaultCPUGenerator().get_state();
  s.precision = format::Precision::bf16;
  s.loss_scale = 32768;
  s.lr = 3e-4;
  s.clip = 1.0;
  s.config = {{"model", "gpt"}, {"faults", "log_nonpositive@42:0"}};
  format::Birth birth;
  birth.op = {
      17, "aten::log", format::Phase::forward, "blocks.0.mlp", "", "", 31, {"bfloat16", {2, 8, 256}, -1, 4, 4, 12, 0}};
  birth.kind = format::BirthKind::nan;
  birth.inputs = {{"bfloat16", {2, 8, 256}, -0.2, 4, 4, 0, 0}};
  s.capture.reproduced = true;
  s.capture.ops_seen = 120;
  s.capture.first_birth = birth;
  s.capture.first_nan_birth = birth;
  s.capture.trail = {birth.op};
  s.capture.discarded = {"inf at aten::log (forward) in module 'encoder.block.0.layer.0.SelfAttention'",
                         "nan at input 'cached' (input) in module '', batch row 2"};
  s.capture.batch_not_read = true;
  s.layer_names = {"blocks.0.mlp.fc", "head"};
  s.layer_grad_norm = {std::nanf(""), 0.5f};

  const std::string path = dir.file("step.h5");
  probe::write_snapshot(path, s);
  probe::SnapshotContents r = probe::read_snapshot(path);
  EXPECT_EQ(r.step, 42);
  EXPECT_EQ(r.model_name, "gpt");
  EXPECT_EQ(r.model_hparams, s.model_hparams);
  EXPECT_EQ(r.torchscript_bytes, s.torchscript_bytes);
  ASSERT_EQ(r.parameters.size(), 2u);
  EXPECT_EQ(r.parameters[0].first, "blocks.0.attn.qkv.weight");
  EXPECT_TRUE(at::equal(r.parameters[0].second, s.parameters[0].second));
  EXPECT_EQ(r.optimizer_state[1].first, "head.bias/step");
  EXPECT_EQ(r.optimizer_state[1].second.item<int64_t>(), 7);
  EXPECT_TRUE(at::equal(r.batch.inputs, s.batch.inputs));
  EXPECT_TRUE(at::equal(r.cpu_rng_state, s.cpu_rng_state));
  EXPECT_EQ(r.precision, format::Precision::bf16);
  EXPECT_DOUBLE_EQ(r.loss_scale, 32768);
  EXPECT_EQ(r.config, s.config);
  ASSERT_TRUE(r.capture.first_birth);
  EXPECT_EQ(r.capture.first_birth->op.op, "aten::log");
  EXPECT_EQ(r.capture.first_birth->op.module, "blocks.0.mlp");
  EXPECT_EQ(r.capture.discarded, s.capture.discarded);
  EXPECT_TRUE(r.capture.batch_not_read);
  EXPECT_EQ(r.capture.first_birth->op.output.nan_count, 12);
  EXPECT_DOUBLE_EQ(r.capture.first_birth->inputs[0].min, -0.2);
  EXPECT_FALSE(r.capture.first_inf_birth);
  EXPECT_EQ(r.capture.trail.size(), 1u);
  EXPECT_EQ(r.layer_names, s.layer_names);
  EXPECT_TRUE(std::isnan(r.layer_grad_norm[0]));
}

namespace {

// Trains 12 gpt steps with faults at 3 and 8, writing under `run_dir`.
test::CommandResult train_with_faults(const std::string& run_dir) {
  return test::run_command(std::string(test::paths::train_exe) +
                           " --model gpt --steps 12 --batch-size 4 --quiet --threads 1 --fault log_nonpositive@3"
                           " --fault exp_overflow@8 --run-dir " +
                           run_dir);
}

void expect_training_went_on(const std::string& run_dir, const test::CommandResult& r) {
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto run = format::read_run(run_dir + "/run.h5");
  EXPECT_EQ(run.rows(), 12u) << "every step ran";
  int failures = 0, snapshots = 0;
  for (const auto& e : run.events) {
    failures += e.kind == format::EventKind::snapshot_failed;
    snapshots += e.kind == format::EventKind::snapshot;
  }
  EXPECT_EQ(failures, 2);
  EXPECT_EQ(snapshots, 0);
  // Reported once on stderr, not once per failure.
  const auto first = r.output.find("cannot write snapshot");
  ASSERT_NE(first, std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("cannot write snapshot", first + 1), std::string::npos) << r.output;
}

}  // namespace

// The generator state every re-run starts from is read when the file is:
// bytes that are no CPU generator's state make the snapshot a bad file, named.
TEST(Snapshot, ARandomStateThatIsNoGeneratorsIsABadFile) {
  test::TempDir dir;
  probe::SnapshotContents s;
  s.step = 1;
  s.model_name = "Net";
  s.batch = Batch(at::ones({2, 3}), at::zeros({2}));
  s.batch_rows = at::arange(2, at::kLong);
  s.cpu_rng_state = at::zeros({7}, at::kByte);
  const std::string path = dir.file("step.h5");
  probe::write_snapshot(path, s);
  try {
    probe::read_snapshot(path);
    FAIL() << "a snapshot with a 7-byte generator state was read";
  } catch (const format::FormatError& e) {
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("rng/cpu_state (7 bytes) is not the state of a CPU random generator"),
              std::string::npos)
        << e.what();
  }
}

// A dict batch of (seq, batch) tensors from a Python loop, a micro-batch of a
// step with gradient accumulation: its tensors, structure, row dimension and
// the birth's micro-batch come back as written.
TEST(Snapshot, RoundTripsANestedMicroBatchAndItsRowDimension) {
  test::TempDir dir;
  probe::SnapshotContents s;
  s.step = 3;
  s.model_name = "Net";
  s.batch = Batch::nested({at::randint(0, 9, {6, 4}, at::kLong), at::ones({6, 4}), at::randint(0, 2, {24}, at::kLong)},
                          R"({"d": [["input_ids", {"t": 0}], ["attention_mask", {"t": 1}], ["labels", {"t": 2}]]})", 1);
  s.batch_rows = at::full({4}, -1, at::kLong);
  format::Birth birth;
  birth.op.op = "aten::div";
  birth.micro_batch = 2;
  birth.rows = {1};
  s.capture.first_birth = birth;
  const std::string path = dir.file("step.h5");
  probe::write_snapshot(path, s);
  const probe::SnapshotContents r = probe::read_snapshot(path);
  ASSERT_TRUE(r.batch.is_nested());
  EXPECT_EQ(r.batch.structure, s.batch.structure);
  EXPECT_EQ(r.batch.row_dim, 1);
  ASSERT_EQ(r.batch.leaves.size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_TRUE(at::equal(r.batch.leaves[i], s.batch.leaves[i]));
  EXPECT_EQ(r.batch.rows(), 4);
  // A row is cut along dimension 1 where a tensor has the batch's size there;
  // the flattened labels (a (6, 4) target's view(-1)) lose that sample's 6 entries.
  const Batch without = r.batch.without_row(2);
  EXPECT_EQ(without.leaves[0].sizes(), (std::vector<int64_t>{6, 3}));
  const at::Tensor kept = at::tensor(std::vector<int64_t>{0, 1, 3});
  EXPECT_TRUE(at::equal(without.leaves[2], s.batch.leaves[2].view({6, 4}).index_select(1, kept).reshape({-1})));
  ASSERT_TRUE(r.capture.first_birth);
  EXPECT_EQ(r.capture.first_birth->micro_batch, 2);
  EXPECT_EQ(format::birth_text(*r.capture.first_birth).find("micro-batch 2, batch row 1") != std::string::npos, true);
}

TEST(Snapshot, UnwritableSnapshotDirectoryLeavesTrainingRunning) {
  test::TempDir dir;
  std::filesystem::create_directories(dir.file("run"));
  std::ofstream(dir.file("run/snapshots")) << "a file where the directory should be";
  auto r = train_with_faults(dir.file("run"));
  expect_training_went_on(dir.file("run"), r);
}

TEST(Snapshot, FullFilesystemLeavesTrainingRunning) {
  test::TempDir dir;
  const std::string full = dir.file("full");
  std::filesystem::create_directories(full);
  // A tmpfs with room for run.h5 but not for a snapshot of the model.
  const test::TmpfsMount disk(full, "384k");
  if (!disk.mounted()) GTEST_SKIP() << "cannot mount a tmpfs here (needs root)";
  auto r = train_with_faults(full + "/run");
  expect_training_went_on(full + "/run", r);
}

TEST(ActivationAbsmax, RecordedEveryNStepsPerLayerWithHeadroom) {
  test::TempDir dir;
  auto r =
      test::run_command(std::string(test::paths::train_exe) +
                        " --model mlp --steps 6 --act-absmax-every 3 --quiet --threads 1 --run-dir " + dir.file("run"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto run = format::read_run(dir.file("run/run.h5"));
  ASSERT_EQ(run.layer_names, (std::vector<std::string>{"fc1", "ln", "fc2", "head"}));
  ASSERT_EQ(run.layer_act_absmax.size(), 6u * 4u);
  for (size_t step = 0; step < 6; ++step)
    for (size_t layer = 0; layer < 4; ++layer) {
      const float v = run.layer_act_absmax[step * 4 + layer];
      if (step % 3 == 0) {
        EXPECT_TRUE(std::isfinite(v) && v > 0 && v < 1e3) << "step " << step << " layer " << layer << ": " << v;
      } else {
        EXPECT_TRUE(std::isnan(v)) << "step " << step << " was not a recording step";
      }
    }
  EXPECT_NEAR(probe::headroom_bits(65504.0 / 8, 65504.0), 3.0, 1e-12);
}

TEST(ActivationAbsmax, SeesTheBlowUpThatOverflowsFp16) {
  // activation_overflow blows up blocks.0.mlp's pre-activation (~1e5, fine in
  // fp32): the next layer, blocks.0.mlp.proj, outputs ~4e4 where it output
  // ~0.06: from over 10 bits of headroom to fp16's 65504 down to under one.
  test::TempDir dir;
  auto r = test::run_command(std::string(test::paths::train_exe) +
                             " --model gpt --steps 2 --batch-size 4 --act-absmax-every 1 --quiet --threads 1"
                             " --fault activation_overflow@1 --run-dir " +
                             dir.file("run"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto run = format::read_run(dir.file("run/run.h5"));
  const auto& names = run.layer_names;
  const size_t proj = std::find(names.begin(), names.end(), "blocks.0.mlp.proj") - names.begin();
  ASSERT_LT(proj, names.size());
  const float before = run.layer_act_absmax[0 * names.size() + proj];
  const float during = run.layer_act_absmax[1 * names.size() + proj];
  EXPECT_GT(probe::headroom_bits(before, 65504.0), 10.0) << before;
  EXPECT_LT(probe::headroom_bits(during, 65504.0), 1.0) << during;
}

TEST(Snapshot, OnePerDistinctFirstBirthUpToMaxSnapshots) {
  // Steps 2-4 go NaN at the same op and module, 6 and 8 at others; the run
  // ends on a skipped step. With --max-snapshots 2: snapshots at 2 and 6 only.
  test::TempDir dir;
  auto r = test::run_command(std::string(test::paths::train_exe) +
                             " --model gpt --steps 12 --batch-size 4 --threads 1 --log-every 1 --max-snapshots 2"
                             " --fault log_nonpositive@2 --fault log_nonpositive@3 --fault log_nonpositive@4"
                             " --fault exp_overflow@6 --fault sqrt_grad_zero@8 --fault log_nonpositive@11"
                             " --run-dir " +
                             dir.file("run"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto run = format::read_run(dir.file("run/run.h5"));
  std::vector<int64_t> written, skipped;
  std::string skipped_text;
  for (const auto& e : run.events) {
    if (e.kind == format::EventKind::snapshot) written.push_back(e.step);
    if (e.kind == format::EventKind::snapshot_skipped) {
      skipped.push_back(e.step);
      skipped_text += e.text + "\n";
    }
  }
  EXPECT_EQ(written, (std::vector<int64_t>{2, 6}));
  EXPECT_EQ(skipped, (std::vector<int64_t>{3, 4, 8, 11})) << skipped_text;
  EXPECT_NE(skipped_text.find("same first birth as the snapshot of step 2 (1 skipped so far)"), std::string::npos)
      << skipped_text;
  EXPECT_NE(skipped_text.find("--max-snapshots 2 reached (3 skipped so far)"), std::string::npos) << skipped_text;
  size_t files = 0;
  for ([[maybe_unused]] const auto& f : std::filesystem::directory_iterator(dir.file("run/snapshots"))) ++files;
  EXPECT_EQ(files, 2u);

  // The last step was skipped: its progress line and the summary both name the
  // last finite loss, the same one.
  const std::string progress_text = "step 12/12  loss nan (skipped; last finite ";
  const std::string summary_text = "last finite loss ";
  const auto progress = r.output.find(progress_text);
  ASSERT_NE(progress, std::string::npos) << r.output;
  const auto summary = r.output.find(summary_text);
  ASSERT_NE(summary, std::string::npos) << r.output;
  const double in_progress = std::stod(r.output.substr(progress + progress_text.size()));
  const double in_summary = std::stod(r.output.substr(summary + summary_text.size()));
  EXPECT_NEAR(in_progress, in_summary, 1e-4);
  EXPECT_NE(r.output.find(" at step 10)"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("(step 10)"), std::string::npos) << r.output;
}

TEST(NestedBatchSnapshot, NamesItsTensorsByKeyAndPositionAndTheOneThatHoldsANan) {
  // The structures the Python side writes (nanscope/_batch.py), as json.dumps spaces them.
  const std::string dict = R"({"d": [["pixel_values", {"t": 0}], ["labels", {"t": 1}], ["note", {"v": "a \"b\" ]"}]]})";
  at::Tensor pixels = at::zeros({4, 3}), labels = at::zeros({4}, at::kLong);
  pixels[2][1] = std::numeric_limits<float>::quiet_NaN();
  const Batch named = Batch::nested({pixels, labels}, dict);
  EXPECT_EQ(named.leaf_names(), (std::vector<std::string>{"pixel_values", "labels"}));
  EXPECT_EQ(named.first_nonfinite_row(), 2);
  EXPECT_EQ(named.nonfinite_tensor_name(2), "pixel_values");
  const std::string nested = R"({"u": [{"d": [["input_ids", {"t": 0}], ["embeds", {"t": 1}]]}, {"l": [{"t": 2}]}]})";
  EXPECT_EQ(Batch::nested({labels, pixels, labels}, nested).leaf_names(),
            (std::vector<std::string>{"[0].input_ids", "[0].embeds", "[1][0]"}));
  EXPECT_TRUE(Batch(pixels, labels).leaf_names().empty()) << "an (inputs, targets) batch names nothing";
  EXPECT_EQ(Batch::nested({pixels}, "{not json").leaf_names(), std::vector<std::string>{""}) << "unnamed, no throw";
}

namespace {

// torchvision's detection batch, as the Python side writes it: (images,
// targets), images a tuple of (3, H, W) tensors of different sizes, targets
// a tuple of dicts of each image's boxes and labels (as many as it has).
Batch detection_batch(std::vector<at::Tensor>& leaves) {
  const int64_t n = 4;
  std::string images = "{\"u\": [", targets = "{\"u\": [";
  for (int64_t i = 0; i < n; ++i) {
    leaves.push_back(at::rand({3, 4 + i, 4}));  // H = 4 for image 0: a dimension as long as the batch
    images += (i ? ", " : "") + std::string("{\"t\": ") + std::to_string(leaves.size() - 1) + "}";
  }
  for (int64_t i = 0; i < n; ++i) {
    leaves.push_back(at::rand({i % 2 + 1, 4}));
    leaves.push_back(at::ones({i % 2 + 1}, at::kLong));
    targets += (i ? ", " : "") + std::string("{\"d\": [[\"boxes\", {\"t\": ") + std::to_string(leaves.size() - 2) +
               "}], [\"labels\", {\"t\": " + std::to_string(leaves.size() - 1) + "}]]}";
  }
  return Batch::nested(leaves, "{\"u\": [" + images + "]}, " + targets + "]}]}");
}

}  // namespace

TEST(NestedBatchSnapshot, ListsOfPerSampleItemsAreTheBatchsRows) {
  std::vector<at::Tensor> leaves;
  Batch batch = detection_batch(leaves);
  EXPECT_EQ(batch.rows(), 4) << "the lists' length, not an image's channels";
  EXPECT_EQ(batch.leaf_names()[6], "[1][1].boxes");
  // A NaN box coordinate of image 3, then a NaN pixel of image 2: each named by its item.
  leaves[10][0][2] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(batch.first_nonfinite_row(), 3);
  EXPECT_EQ(batch.nonfinite_tensor_name(3), "[1][3].boxes");
  EXPECT_EQ(batch.row_of(3).sizes(), leaves[10].sizes());
  leaves[2][1][3][3] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(batch.first_nonfinite_row(), 2);
  EXPECT_EQ(batch.nonfinite_tensor_name(2), "[0][2]");
  EXPECT_EQ(batch.row_dim_of(leaves[0], 0, 4), -1) << "an image's H as long as the batch is no row dimension";
  // A row is another item's tensors in its place, never cut; each sample its own fingerprint.
  const Batch replaced = batch.with_row_replaced(2, 0);
  EXPECT_TRUE(replaced.leaves[2].is_same(leaves[0]));
  EXPECT_TRUE(replaced.leaves[8].is_same(leaves[4])) << "image 2's boxes are image 0's";
  EXPECT_TRUE(replaced.leaves[3].is_same(leaves[3]));
  EXPECT_EQ(replaced.structure, batch.structure);
  EXPECT_THROW(batch.without_row(2), std::invalid_argument);
  EXPECT_NE(batch.row_fingerprint(2), batch.row_fingerprint(3));
  EXPECT_EQ(replaced.row_fingerprint(2), batch.row_fingerprint(0));
  // Two tokenized views of a contrastive pair (dicts alike, one batch each) are no sample list.
  const Batch views = Batch::nested(
      {at::zeros({8, 5}), at::zeros({8, 5}), at::zeros({8, 5}), at::zeros({8, 5})},
      R"({"u": [{"d": [["input_ids", {"t": 0}], ["mask", {"t": 1}]]}, {"d": [["input_ids", {"t": 2}], ["mask", {"t": 3}]]}]})");
  EXPECT_EQ(views.rows(), 8);
}
