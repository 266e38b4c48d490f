#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>

#include "../support/test_support.hpp"
#include "nanscope/format/archive.hpp"
#include "nanscope/format/data_file.hpp"
#include "nanscope/format/error.hpp"
#include "nanscope/format/precision_trail.hpp"
#include "nanscope/format/snapshot_inventory.hpp"
#include "nanscope/format/version.hpp"

using namespace nanscope::format;
using nanscope::test::TempDir;

namespace {

template <typename T>
std::vector<T> values_of(const TensorData& t) {
  std::vector<T> out(t.bytes.size() / sizeof(T));
  std::memcpy(out.data(), t.bytes.data(), t.bytes.size());
  return out;
}

// What a read that must be refused says: the FormatError's message.
template <typename Read>
std::string refusal(Read read) {
  try {
    read();
  } catch (const FormatError& e) {
    return e.what();
  }
  return "read without complaint";
}

// A checkpoint-kind file written by h5py: nanscope's identity attributes, then
// `body` (Python lines, indented, with the file open as `f`).
void make_checkpoint_with_h5py(const std::string& path, const std::string& body) {
  const std::string make = std::string(nanscope::test::paths::python) +
                           " -c \"import h5py, sys, numpy as np\n"
                           "with h5py.File(sys.argv[1], 'w') as f:\n"
                           "    f.attrs['format'] = np.bytes_('nanscope-checkpoint')\n"
                           "    f.attrs['format_version'] = np.bytes_('1.0')\n" +
                           body + "\" " + path;
  ASSERT_EQ(std::system(make.c_str()), 0);
}

}  // namespace

TEST(Archive, RoundTripsNestedGroupsTensorsAttributesAndBlobs) {
  TempDir dir;
  const std::string path = dir.file("snap.h5");
  const std::vector<float> weights{1.5f, -2.0f, 3.25f, 0.0f, 1e30f, -1e-30f};
  const std::vector<int64_t> rows{3, 1, 4};
  const std::vector<uint16_t> halves{0x3c00, 0x7c00, 0x7e00};  // 1.0, +inf, NaN in fp16
  const double scalar = 65536.0;
  const std::string blob("PK\x03\x04\0binary\xff", 12);
  {
    Archive archive = Archive::create(path, kSnapshotFileKind);
    Group root = archive.root();
    root.set_attr("step", int64_t(6));
    root.set_attr("loss_scale", 32768.0);
    root.set_attr("op", std::string("aten::log"));
    Group weights_group = root.group("model").group("weights");
    weights_group.put_tensor("blocks.0.attn.qkv.weight", DType::float32, {2, 3}, weights.data());
    root.group("batch").put_tensor("rows", DType::int64, {3}, rows.data());
    root.group("batch").put_tensor("halves", DType::float16, {3}, halves.data());
    root.put_tensor("scale", DType::float64, {}, &scalar);
    root.put_tensor("empty", DType::float32, {0, 4}, nullptr);
    root.group("model").put_blob("torchscript", blob.data(), blob.size());
    archive.close();
  }
  Archive archive = Archive::open(path, kSnapshotFileKind);
  Group root = archive.root();
  EXPECT_EQ(root.attr_int("step"), 6);
  EXPECT_DOUBLE_EQ(root.attr_double("loss_scale"), 32768.0);
  EXPECT_EQ(root.attr_string("op"), "aten::log");
  EXPECT_EQ(root.children(), (std::vector<std::string>{"batch", "empty", "model", "scale"}));

  TensorData w = root.group("model").group("weights").tensor("blocks.0.attn.qkv.weight");
  EXPECT_EQ(w.dtype, DType::float32);
  EXPECT_EQ(w.shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(values_of<float>(w), weights);
  EXPECT_EQ(values_of<int64_t>(root.group("batch").tensor("rows")), rows);
  TensorData h = root.group("batch").tensor("halves");
  EXPECT_EQ(h.dtype, DType::float16);
  EXPECT_EQ(values_of<uint16_t>(h), halves);
  TensorData s = root.tensor("scale");
  EXPECT_TRUE(s.shape.empty());
  EXPECT_EQ(values_of<double>(s), std::vector<double>{scalar});
  TensorData e = root.tensor("empty");
  EXPECT_EQ(e.shape, (std::vector<int64_t>{0, 4}));
  EXPECT_TRUE(e.bytes.empty());
  EXPECT_EQ(root.group("model").blob("torchscript"), blob);
  // Their shapes and sizes, read without their bytes (nanscope-replay --inspect).
  const TensorData shape_only = root.group("model").group("weights").tensor_shape("blocks.0.attn.qkv.weight");
  EXPECT_EQ(shape_only.dtype, DType::float32);
  EXPECT_EQ(shape_only.shape, (std::vector<int64_t>{2, 3}));
  EXPECT_TRUE(shape_only.bytes.empty());
  EXPECT_EQ(root.group("model").blob_size("torchscript"), int64_t(blob.size()));
  EXPECT_THROW(root.group("model").blob_size("weights"), FormatError);  // a group, not a blob
}

TEST(Archive, AppendsToAnExistingFile) {
  TempDir dir;
  const std::string path = dir.file("snap.h5");
  Archive::create(path, kSnapshotFileKind).close();
  {
    Archive archive = Archive::open(path, kSnapshotFileKind, /*writable=*/true);
    archive.root().group("replay").set_attr("verdict", std::string("precision"));
    archive.close();
  }
  EXPECT_EQ(Archive::open(path, kSnapshotFileKind).root().group("replay").attr_string("verdict"), "precision");
}

TEST(Archive, MissingMembersNameTheFileAndThePath) {
  TempDir dir;
  const std::string path = dir.file("snap.h5");
  Archive::create(path, kSnapshotFileKind).close();
  Archive archive = Archive::open(path, kSnapshotFileKind);
  try {
    archive.root().group("capture");
    FAIL();
  } catch (const FormatError& e) {
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("/capture missing"), std::string::npos);
  }
  EXPECT_THROW(archive.root().attr_int("step"), FormatError);
}

TEST(Archive, WrongKindIsRejected) {
  TempDir dir;
  const std::string path = dir.file("ckpt.h5");
  Archive::create(path, kCheckpointFileKind).close();
  EXPECT_THROW(Archive::open(path, kSnapshotFileKind), FormatError);
}

TEST(DataFile, RoundTripsAndChecksSampleCounts) {
  TempDir dir;
  const std::string path = dir.file("data.h5");
  std::vector<float> x{1, 2, 3, 4, 5, 6};
  std::vector<int64_t> y{0, 1, 0};
  DataFile data;
  data.inputs = {DType::float32, {3, 2}, {}};
  data.inputs.bytes.resize(x.size() * 4);
  std::memcpy(data.inputs.bytes.data(), x.data(), x.size() * 4);
  data.targets = {DType::int64, {3}, {}};
  data.targets.bytes.resize(y.size() * 8);
  std::memcpy(data.targets.bytes.data(), y.data(), y.size() * 8);
  write_data_file(path, data);
  DataFile back = read_data_file(path);
  EXPECT_EQ(back.inputs.shape, (std::vector<int64_t>{3, 2}));
  EXPECT_EQ(values_of<float>(back.inputs), x);
  EXPECT_EQ(values_of<int64_t>(back.targets), y);

  data.targets.shape = {2};
  data.targets.bytes.resize(16);
  write_data_file(path, data);
  try {
    read_data_file(path);
    FAIL();
  } catch (const FormatError& e) {
    EXPECT_NE(std::string(e.what()).find("/inputs has 3 samples but /targets has 2"), std::string::npos);
  }
}

// What a file says of its own sizes is not believed: a data file of 2 KB
// (fuzzing found it) whose dataset claims 512 GB of contiguous storage is
// refused against its size on disk. A dataset kept in other files (HDF5's
// external storage) is refused too: the file would choose what is read.
TEST(DataFile, SizesTheFileClaimsAndDataKeptElsewhereAreRefused) {
  // HDF5 1.10 opens the dataset and the size check refuses it; 1.14 already
  // refuses to open it. Either way: named, and nothing allocated for it.
  const std::string lie = std::string(nanscope::test::paths::fuzz_crashers) + "/data_file/storage-size-lie.h5";
  const std::string why = refusal([&] { read_data_file(lie); });
  EXPECT_NE(why.find(lie), std::string::npos) << why;
  EXPECT_TRUE(why.find("/inputs claims 549755813984 bytes, more than the whole file (2205 bytes") !=
                  std::string::npos ||
              why.find("cannot open /inputs") != std::string::npos)
      << why;

  TempDir dir;
  const std::string path = dir.file("external.h5");
  const std::string make =
      std::string(nanscope::test::paths::python) +
      " -c \"import h5py, sys, numpy as np\n"
      "with h5py.File(sys.argv[1], 'w') as f:\n"
      "    f.create_dataset('inputs', shape=(4, 2), dtype='<f4', external=[(sys.argv[2], 0, 32)])\n"
      "    f['targets'] = np.zeros(4, dtype='<i8')\" " +
      path + " " + dir.file("elsewhere.bin");
  ASSERT_EQ(std::system(make.c_str()), 0);
  const std::string elsewhere = refusal([&] { read_data_file(path); });
  EXPECT_NE(elsewhere.find("/inputs keeps its data in other files (not supported)"), std::string::npos) << elsewhere;
}

// A reader's rehearsal reads datasets in their stored type; the real read
// must then not convert (HDF5's conversions crash on corrupt type fields), so
// a tensor stored in any other type than nanscope's is refused, named.
TEST(Archive, ATensorStoredInAnotherTypeIsRefusedNotConverted) {
  TempDir dir;
  const std::string path = dir.file("other-types.h5");
  make_checkpoint_with_h5py(path,
                            "    for name, stored in (('wide', '<f8'), ('big_endian', '>f4'), ('ok', '<f4')):\n"
                            "        d = f.create_dataset('parameters/' + name, data=np.ones(3, dtype=stored))\n"
                            "        d.attrs['dtype'] = np.bytes_('float32')\n"
                            "    f.create_dataset('blobs/b', data=np.ones(3, dtype='<i4'))\n");
  Archive archive = Archive::open(path, kCheckpointFileKind);
  const Group params = archive.root().group("parameters");
  EXPECT_EQ(params.tensor("ok").shape, std::vector<int64_t>{3});
  EXPECT_NE(refusal([&] {
              params.tensor("wide");
            }).find("/parameters/wide is stored as a 64-bit float, not as the little-endian 32-bit float"),
            std::string::npos);
  EXPECT_NE(refusal([&] {
              params.tensor("big_endian");
            }).find("/parameters/big_endian is stored as a 32-bit float of another layout"),
            std::string::npos);
  EXPECT_NE(refusal([&] {
              archive.root().group("blobs").blob("b");
            }).find("blob /blobs/b is stored as a 32-bit integer, not as the little-endian 8-bit integer"),
            std::string::npos);
}

// A corrupt shape must not become a giant allocation: a tensor whose
// dataspace claims 4 TiB in a file of a few KB is refused by name.
TEST(Archive, AShapeClaimingMoreThanTheFileStoresIsRefused) {
  TempDir dir;
  const std::string path = dir.file("giant.h5");
  make_checkpoint_with_h5py(path,
                            "    d = f.create_dataset('parameters/w', shape=(2**40,), dtype='f4', chunks=(1024,))\n"
                            "    d.attrs['dtype'] = np.bytes_('float32')\n");
  Archive archive = Archive::open(path, kCheckpointFileKind);
  try {
    archive.root().group("parameters").tensor("w");
    FAIL() << "read a 4 TiB tensor";
  } catch (const FormatError& e) {
    EXPECT_NE(std::string(e.what()).find("/parameters/w claims 4398046511104 bytes, more than the whole file"),
              std::string::npos)
        << e.what();
  }
}

// What the viewer's snapshot tab and nanscope-replay --inspect say of where a
// replay's code comes from: a warning exactly when the file carries code.
TEST(SnapshotInventory, ReplayingIsCalledCodeOnlyWhenTheFileCarriesAProgramOrAPickle) {
  SnapshotSummary built_in;
  built_in.origin = Origin::nanscope_train;
  built_in.model_name = "gpt";
  EXPECT_FALSE(carries_code(built_in));
  EXPECT_NE(replay_runs_text(built_in).find("built-in 'gpt'"), std::string::npos) << replay_runs_text(built_in);
  EXPECT_EQ(replay_runs_text(built_in).find("trust"), std::string::npos) << replay_runs_text(built_in);

  SnapshotSummary scripted = built_in;
  scripted.model_name = "torchscript";
  scripted.program_bytes = 12406;
  EXPECT_TRUE(carries_code(scripted));
  EXPECT_NE(replay_runs_text(scripted).find("TorchScript program of 12406 bytes"), std::string::npos);
  EXPECT_NE(replay_runs_text(scripted).find("nanscope-replay --inspect"), std::string::npos);

  SnapshotSummary pickled;
  pickled.origin = Origin::python;
  pickled.model_name = "Net";
  EXPECT_FALSE(carries_code(pickled));
  pickled.pickled_batch_objects = 2;
  EXPECT_TRUE(carries_code(pickled));
  EXPECT_NE(replay_runs_text(pickled).find("2 pickled Python object(s)"), std::string::npos);
  EXPECT_NE(replay_runs_text(pickled).find("python3 -m nanscope inspect"), std::string::npos);
}

// A replayed snapshot's precision trail reads back as written, columns and
// all, and one whose columns disagree about how many ops it holds is refused
// naming the file, never read past.
TEST(PrecisionTrailFile, IsReadBackAsWrittenAndAMalformedOneIsRefused) {
  TempDir dir;
  const std::string path = dir.file("step.h5");
  PrecisionTrail trail;
  trail.type = "bfloat16";
  trail.unmatched = 2;
  for (int i = 0; i < 3; ++i) {
    OpError e;
    e.op.index = 10 + i;
    e.op.op = i == 1 ? "aten::sub" : "aten::mul";
    e.op.phase = i == 2 ? Phase::backward : Phase::forward;
    e.op.module = i == 0 ? "" : "blocks.0.ln1";  // the root's empty name is a row too
    e.op.backward_node = i == 2 ? "MulBackward0" : "";
    e.max_abs = 0.25 * i;
    e.max_rel = 0.5 * i;
    e.ulps = i == 1 ? 132 : 0.5;
    e.nonfinite = i == 2 ? 7 : 0;
    trail.ops.push_back(e);
  }
  trail.first_lost = first_precision_loss(trail.ops, trail.margin_ulps);
  ASSERT_EQ(trail.first_lost, 1);
  {
    Archive archive = Archive::create(path, kSnapshotFileKind);
    write_precision_trail(archive.root().group("replay").group("precision_trail"), trail);
    archive.close();
  }
  Archive archive = Archive::open(path, kSnapshotFileKind, /*writable=*/true);
  const Group g = archive.root().group("replay").group("precision_trail");
  const PrecisionTrail back = read_precision_trail(g);
  EXPECT_EQ(back.type, "bfloat16");
  EXPECT_EQ(back.first_lost, 1);
  EXPECT_EQ(back.unmatched, 2);
  ASSERT_EQ(back.ops.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(back.ops[i].op.index, trail.ops[i].op.index);
    EXPECT_EQ(back.ops[i].op.op, trail.ops[i].op.op);
    EXPECT_EQ(back.ops[i].op.phase, trail.ops[i].op.phase);
    EXPECT_EQ(back.ops[i].op.module, trail.ops[i].op.module);
    EXPECT_EQ(back.ops[i].op.backward_node, trail.ops[i].op.backward_node);
    EXPECT_EQ(back.ops[i].ulps, trail.ops[i].ulps);
    EXPECT_EQ(back.ops[i].max_abs, trail.ops[i].max_abs);
    EXPECT_EQ(back.ops[i].nonfinite, trail.ops[i].nonfinite);
  }
  const std::vector<int64_t> two = {1, 2};
  g.remove("index");
  g.put_tensor("index", DType::int64, {2}, two.data());
  EXPECT_NE(refusal([&] { read_precision_trail(g); }).find("one value per op"), std::string::npos);
  g.set_attr("count", int64_t(3));
  g.set_attr("first_lost", int64_t(5));
  EXPECT_NE(refusal([&] { read_precision_trail(g); }).find("do not fit together"), std::string::npos);
}
