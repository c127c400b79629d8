// The data-only record format of krab's state files (core/record.h): what it writes reads back
// exactly, and every lie a forged record can tell about its sizes is refused by name, before
// anything of the stated size is allocated.
#include "core/record.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <memory>

#include "core/errors.h"

namespace krab::core {
namespace {

std::string refusal(const std::string& bytes) {
  try {
    Record::parse(bytes.data(), bytes.size(), "dir/state.krab");
  } catch (const CorruptData& e) {
    return e.what();
  }
  ADD_FAILURE() << "the record was accepted";
  return "";
}

// The bytes of one tensor entry as a forger writes them: any dtype code, rank, sizes and count.
std::string tensor_entry(const std::string& name, uint8_t dtype, std::vector<int64_t> sizes,
                         uint64_t count, const std::string& data) {
  std::string out("KREC", 4);
  const uint32_t n = 1;
  out.append(reinterpret_cast<const char*>(&n), 4);
  const uint16_t len = static_cast<uint16_t>(name.size());
  out.append(reinterpret_cast<const char*>(&len), 2);
  out += name;
  out += '\x01';
  out += static_cast<char>(dtype);
  out += static_cast<char>(sizes.size());
  for (const int64_t s : sizes) out.append(reinterpret_cast<const char*>(&s), 8);
  out.append(reinterpret_cast<const char*>(&count), 8);
  return out + data;
}

TEST(Record, EveryKindReadsBackExactlyInOrder) {
  RecordWriter w;
  const at::Tensor f = torch::randn({2, 3, 4}).transpose(0, 2);  // not contiguous
  w.add_tensor("f", f);
  w.add_tensor("scalar", torch::tensor(int64_t{-5}));
  w.add_tensor("empty", torch::zeros({0, 7}, torch::kHalf));
  w.add_tensor("mask", torch::tensor({true, false, true}));
  w.add_tensor("rng", torch::arange(0, 200, torch::kByte));
  w.add_int("i", -(int64_t{1} << 40));
  w.add_double("d", 0.1);
  w.add_string("s", std::string("a\0b", 3));
  const std::string bytes = w.bytes();
  const Record r = Record::parse(bytes.data(), bytes.size(), "x");
  EXPECT_EQ(r.names(),
            (std::vector<std::string>{"f", "scalar", "empty", "mask", "rng", "i", "d", "s"}));
  EXPECT_TRUE(torch::equal(r.tensor("f"), f));
  EXPECT_EQ(r.tensor("scalar").dim(), 0);
  EXPECT_EQ(r.tensor("scalar").item<int64_t>(), -5);
  EXPECT_EQ(r.tensor("empty").sizes(), (std::vector<int64_t>{0, 7}));
  EXPECT_EQ(r.tensor("empty").scalar_type(), at::kHalf);
  EXPECT_TRUE(torch::equal(r.tensor("mask"), torch::tensor({true, false, true})));
  EXPECT_TRUE(torch::equal(r.tensor("rng"), torch::arange(0, 200, torch::kByte)));
  EXPECT_EQ(r.integer("i"), -(int64_t{1} << 40));
  EXPECT_EQ(r.real("d"), 0.1);
  EXPECT_EQ(r.text("s"), std::string("a\0b", 3));
  // Asking for the wrong kind, or for what is not there, names the entry.
  try {
    r.integer("s");
    ADD_FAILURE();
  } catch (const CorruptData& e) {
    EXPECT_NE(std::string(e.what()).find("'s' is a string, not an integer"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(r.tensor("nothing"), CorruptData);
}

TEST(Record, LiesAboutSizesAreRefusedBeforeAnythingIsAllocated) {
  const std::string four(16, '\0');
  // dtype 1 = float32. Each case states a size the 16 bytes behind it cannot hold.
  const std::string valid = tensor_entry("t", 1, {4}, 16, four);  // the honest entry
  EXPECT_NO_THROW(Record::parse(valid.data(), valid.size(), "x"));
  const struct {
    std::string bytes, needle;
  } cases[] = {
      {tensor_entry("t", 1, {1 << 30, 1 << 30}, 16, four), "states 16 bytes"},
      {tensor_entry("t", 1, {int64_t{1} << 48, int64_t{1} << 48}, 0, ""), "overflow"},
      // Empty, but LibTorch would multiply the other sizes (found by fuzz_checkpoint).
      {tensor_entry("t", 1, {int64_t{1} << 48, int64_t{1} << 48, 0}, 0, ""), "overflow"},
      {tensor_entry("t", 1, {-4}, 16, four), "size -4"},
      {tensor_entry("t", 1, {4}, 1ull << 40, four), "states 1099511627776 bytes"},
      {tensor_entry("t", 1, {8}, 32, four), "needs 32 bytes"},
      {tensor_entry("t", 1, std::vector<int64_t>(9, 1), 4, four), "rank 9"},
      {tensor_entry("t", 99, {4}, 16, four), "unknown dtype"},
      {tensor_entry("t", 10, {16}, 16, std::string(15, '\0') + '\x02'), "bool"},
      {tensor_entry("bad name", 1, {4}, 16, four), "bad name"},
      {tensor_entry("", 1, {4}, 16, four), "bad name"},
      {tensor_entry("t", 1, {4}, 16, four + "x"), "bytes after the last entry"},
  };
  for (const auto& c : cases) {
    const std::string msg = refusal(c.bytes);
    EXPECT_NE(msg.find("dir/state.krab"), std::string::npos) << msg;
    EXPECT_NE(msg.find(c.needle), std::string::npos) << msg;
  }
}

TEST(Record, CountsNamesAndKindsAreChecked) {
  RecordWriter w;
  w.add_int("a", 1);
  std::string bytes = w.bytes();
  // The same entry twice.
  std::string twice = bytes + bytes.substr(8);
  twice[4] = 2;
  EXPECT_NE(refusal(twice).find("'a' appears twice"), std::string::npos);
  // More entries stated than there are.
  std::string more = bytes;
  more[4] = 3;
  EXPECT_NE(refusal(more).find("remain"), std::string::npos);
  // An unknown kind, a bad magic, a string longer than the file.
  std::string kind = bytes;
  kind[8 + 2 + 1] = 9;
  EXPECT_NE(refusal(kind).find("unknown kind"), std::string::npos);
  EXPECT_NE(refusal("KRAB" + bytes.substr(4)).find("bad magic"), std::string::npos);
  RecordWriter s;
  s.add_string("s", "hello");
  std::string longer = s.bytes();
  longer[8 + 2 + 1 + 1] = 100;  // length 100, 5 bytes there
  EXPECT_NE(refusal(longer).find("remain"), std::string::npos);
  // Every prefix of a valid record is refused, none crashes.
  RecordWriter full;
  full.add_tensor("t", torch::ones({3, 2}));
  full.add_string("s", "text");
  const std::string all = full.bytes();
  for (size_t n = 0; n < all.size(); ++n) EXPECT_NE(refusal(all.substr(0, n)), "") << n;
}

// The streaming writer sends exactly the bytes the in-memory writer builds for the same
// entries (so Record::parse reads a streamed shard as it reads state.krab), declares its size
// before writing, and takes a view that is not contiguous as its values.
TEST(RecordStream, StreamsTheBytesRecordWriterBuildsAndDeclaresTheirSize) {
  const at::Tensor grid = torch::arange(12, torch::kFloat32).view({3, 4});
  const at::Tensor column = grid.select(1, 2);  // not contiguous: 2, 6, 10
  RecordWriter whole;
  RecordStreamWriter stream;
  for (RecordEntries* w :
       {static_cast<RecordEntries*>(&whole), static_cast<RecordEntries*>(&stream)}) {
    w->add_int("meta.step", 7);
    w->add_tensor("grid", grid);
    w->add_tensor("column", column);
    w->add_tensor("empty", torch::zeros({0, 5}, torch::kInt64));
    w->add_double("lr", 0.25);
    w->add_string("name", "cnn");
  }
  std::string out;
  StringSink sink(out);
  stream.write(sink);
  EXPECT_EQ(out, whole.bytes());
  EXPECT_EQ(stream.size(), out.size());
  const Record r = Record::parse(out.data(), out.size(), "stream");
  EXPECT_TRUE(torch::equal(r.tensor("column"), torch::tensor({2.f, 6.f, 10.f})));
  EXPECT_THROW(stream.add_int("grid", 1), Error);  // a repeated name is the caller's bug
}

// A source that counts what is read through it: the bytes in all and the largest single read.
struct CountingSource : ByteSource {
  explicit CountingSource(const std::string& bytes) : inner(bytes.data(), bytes.size(), "big") {}
  uint64_t size() const override { return inner.size(); }
  void read(uint64_t offset, char* dst, size_t n) const override {
    bytes += n;
    largest = std::max<uint64_t>(largest, n);
    inner.read(offset, dst, n);
  }
  const std::string& name() const override { return inner.name(); }
  MemorySource inner;
  mutable uint64_t bytes = 0, largest = 0;
};

// A 64 MiB state file whose small entries sit after a large tensor: indexing it reads the entry
// headers (a few 64 KiB windows), and one small entry or a range of the large one reads those
// bytes alone — never the file. The values equal Record::parse's.
TEST(RecordIndex, ReadsOneEntryOfALargeRecordWithoutReadingTheRest) {
  constexpr int64_t kBig = 16 << 20;  // floats: 64 MiB
  RecordStreamWriter w;
  const at::Tensor big = torch::arange(kBig, torch::kFloat32);
  const at::Tensor small = torch::tensor({1.5f, -2.f, 3.f});
  w.add_tensor("param.big", big);
  w.add_tensor("param.small", small);
  w.add_int("meta.step", 9);
  w.add_string("meta.model_name", "gpt");
  std::string bytes;
  StringSink sink(bytes);
  w.write(sink);
  ASSERT_GT(bytes.size(), uint64_t{64} << 20);
  auto src = std::make_shared<CountingSource>(bytes);
  const RecordIndex index(src, 0, bytes.size(), "dir/state.krab");
  EXPECT_LT(src->bytes, uint64_t{256} << 10) << "indexing read the values";
  EXPECT_EQ(index.names(),
            (std::vector<std::string>{"param.big", "param.small", "meta.step", "meta.model_name"}));
  EXPECT_EQ(index.sizes("param.big"), (std::vector<int64_t>{kBig}));
  src->bytes = 0;
  EXPECT_TRUE(torch::equal(index.tensor("param.small"), small));
  EXPECT_EQ(src->bytes, 12u);
  src->bytes = src->largest = 0;
  std::vector<float> range(5);
  index.read("param.big", 1000003, 5, range.data());
  EXPECT_EQ(src->bytes, 20u);
  EXPECT_EQ(range, (std::vector<float>{1000003, 1000004, 1000005, 1000006, 1000007}));
  EXPECT_EQ(index.integer("meta.step"), 9);
  EXPECT_EQ(index.text("meta.model_name"), "gpt");
  // load() takes what it is asked for, nothing else.
  src->bytes = 0;
  const Record scalars = index.load(
      [](const std::string&, RecordIndex::Kind k) { return k != RecordIndex::Kind::kTensor; });
  EXPECT_LT(src->bytes, 64u);
  EXPECT_EQ(scalars.names(), (std::vector<std::string>{"meta.step", "meta.model_name"}));
  EXPECT_THROW(index.read("param.big", kBig - 2, 3, range.data()), Error);  // the caller's bug
  try {
    index.integer("meta.model_name");
    ADD_FAILURE();
  } catch (const CorruptData& e) {
    EXPECT_NE(std::string(e.what()).find("'meta.model_name' is a string, not an integer"),
              std::string::npos)
        << e.what();
  }
}

// The one check that needs a tensor's bytes, bool values, is made when they are read: the index
// of such a record builds, its bool entry is refused by name on reading (as parse refuses it).
TEST(RecordIndex, RefusesABoolTensorWithAnotherByteWhenItIsRead) {
  const std::string bytes = tensor_entry("mask", 10, {4}, 4, std::string("\x01\x00\x02\x01", 4));
  const RecordIndex index(std::make_shared<MemorySource>(bytes.data(), bytes.size(), "m"), 0,
                          bytes.size(), "dir/state.krab");
  try {
    index.tensor("mask");
    ADD_FAILURE() << "a bool tensor holding 2 was read";
  } catch (const CorruptData& e) {
    EXPECT_NE(std::string(e.what()).find("entry 'mask': a bool tensor holds a byte other than"),
              std::string::npos)
        << e.what();
  }
  bool two[1];
  EXPECT_THROW(index.read("mask", 2, 1, two), CorruptData);
  EXPECT_NE(refusal(bytes).find("bool"), std::string::npos);
}

}  // namespace
}  // namespace krab::core
