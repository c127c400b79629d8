// The text source with a SentencePiece tokenizer: tokens are what SentencePiece itself gives
// for the same lines (Debian's spm_encode run on each line alone), the vocabulary is the model's
// (spm_export_vocab's lines), and a file that is not a model is refused naming the key and the
// file. The model is trained here by spm_train.
#include "data/tokenizer.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "core/errors.h"
#include "core/fs.h"
#include "data/dataset.h"
#include "test_util.h"

namespace krab::data {
namespace {

// A small corpus: 64 made-up words from 16 syllables, in lines of three, some blank lines.
std::string corpus() {
  const char* syllables[] = {"ka", "lo", "mi", "nu", "pe", "ra", "si", "to",
                             "va", "ze", "bo", "di", "fu", "ga", "hi", "ju"};
  std::ostringstream out;
  for (int i = 0; i < 600; ++i) {
    for (int w = 0; w < 3; ++w) {
      const int k = (i * 7 + w * 13) % 64;
      out << syllables[k % 16] << syllables[(k / 4 + w) % 16] << (w < 2 ? " " : " .");
    }
    out << (i % 7 == 0 ? "\n\n" : "\n");
  }
  return out.str();
}

class SentencePieceText : public ::testing::Test {
 protected:
  void SetUp() override {
    text_path_ = (dir_.path() / "corpus.txt").string();
    std::ofstream(text_path_) << corpus();
    const std::string prefix = (dir_.path() / "sp").string();
    const std::string cmd = "spm_train --input=" + text_path_ + " --model_prefix=" + prefix +
                            " --vocab_size=60 --hard_vocab_limit=false --model_type=unigram "
                            "--num_threads=1 "
                            "--minloglevel=2 >/dev/null 2>&1";
    ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
    model_path_ = prefix + ".model";
  }
  testing::TempDir dir_;
  std::string text_path_, model_path_;
};

TEST_F(SentencePieceText, TokensAreSentencePiecesOwnLineByLineAndTheVocabularyIsTheModels) {
  // Each distinct line encoded alone by spm_encode (the corpus repeats a few lines).
  std::map<std::string, std::vector<int64_t>> encoded;
  std::vector<int64_t> expected;
  std::istringstream lines(corpus());
  for (std::string line; std::getline(lines, line);) {
    if (line.empty()) continue;
    if (!encoded.count(line)) {
      const std::string one = (dir_.path() / "line.txt").string();
      std::ofstream(one) << line << "\n";
      const std::string cmd = "spm_encode --model=" + model_path_ + " --output_format=id < " + one;
      std::FILE* p = popen(cmd.c_str(), "r");
      ASSERT_NE(p, nullptr);
      std::vector<int64_t> ids;
      for (long long id; std::fscanf(p, "%lld", &id) == 1;) ids.push_back(id);
      ASSERT_EQ(pclose(p), 0);
      encoded[line] = ids;
    }
    expected.insert(expected.end(), encoded[line].begin(), encoded[line].end());
  }
  int64_t pieces = 0;
  {
    std::FILE* p = popen(("spm_export_vocab --model=" + model_path_).c_str(), "r");
    for (int ch; (ch = std::fgetc(p)) != EOF;) pieces += ch == '\n';
    ASSERT_EQ(pclose(p), 0);
  }
  const int64_t context = 16;
  const auto tokenizer = sentencepiece_tokenizer(model_path_, "data.tokenizer.sentencepiece");
  EXPECT_EQ(tokenizer->vocab_size(), pieces);
  EXPECT_GE(pieces, 20);
  EXPECT_LE(pieces, 60);
  const DataSplits d = load_text(text_path_, context, 0.1, *tokenizer);
  EXPECT_EQ(d.num_classes, pieces);
  EXPECT_TRUE(d.language_model);
  const int64_t windows = static_cast<int64_t>(expected.size()) / (context + 1);
  ASSERT_TRUE(d.test.has_value());
  ASSERT_EQ(d.train.size() + d.test->size(), windows);
  // Window i is tokens [i (context + 1), (i + 1)(context + 1)); inputs drop its last token,
  // targets its first.
  for (int64_t i : {int64_t{0}, int64_t{1}, d.train.size() - 1}) {
    for (int64_t t = 0; t < context; ++t) {
      ASSERT_EQ(d.train.inputs[i][t].item<int64_t>(), expected[i * (context + 1) + t]);
      ASSERT_EQ(d.train.targets[i][t].item<int64_t>(), expected[i * (context + 1) + t + 1]);
    }
  }
  // Fewer tokens than bytes: the pieces are longer than one byte.
  EXPECT_LT(expected.size(), corpus().size() / 2);
}

TEST_F(SentencePieceText, BytesRemainTheDefault) {
  const DataSplits d = load_text(text_path_, 16, 0.0);
  EXPECT_EQ(d.num_classes, 256);
  EXPECT_EQ(d.train.inputs[0][0].item<int64_t>(), static_cast<unsigned char>(corpus()[0]));
}

// What is not a model is refused in one line naming the key and the file, in krab's words: a
// text file, an empty file, a model cut short, and bytes that parse as protobuf but that
// SentencePiece refuses (one piece "a", no <unk>), where spm_export_vocab's own reason is kept
// without its source locations (it printed `spm_export_vocab_main.cc(35) [...]` before).
TEST_F(SentencePieceText, AFileThatIsNotAModelIsRefusedNamingTheKeyAndTheFile) {
  const std::string key = "data.tokenizer.sentencepiece";
  const std::string model = core::read_file(model_path_);
  const std::string empty = dir_.file("empty.model"), cut = dir_.file("cut.model"),
                    no_unk = dir_.file("no-unk.model");
  std::ofstream(empty).flush();
  // Without its last byte: whatever the last field is, its value now runs past the end.
  std::ofstream(cut, std::ios::binary) << model.substr(0, model.size() - 1);
  std::ofstream(no_unk, std::ios::binary) << std::string(
      "\x0a\x03\x0a\x01"
      "a",
      5);
  const std::pair<std::string, std::string> cases[] = {
      {text_path_, "does not start a field"},
      {empty, "the file is empty"},
      {cut, "does not start a field"},
      {no_unk, "spm_export_vocab refused it: unk is not defined"}};
  for (const auto& [file, why] : cases) {
    SCOPED_TRACE(file);
    try {
      sentencepiece_tokenizer(file, key);
      ADD_FAILURE() << "accepted";
    } catch (const InvalidArgument& e) {
      const std::string what = e.what();
      EXPECT_EQ(what.rfind(key + ": '" + file + "' is not a SentencePiece model (", 0), 0u) << what;
      EXPECT_NE(what.find(why), std::string::npos) << what;
      EXPECT_EQ(what.find('\n'), std::string::npos) << what;
      EXPECT_EQ(what.find(".cc("), std::string::npos) << what;
    }
  }
  testing::expect_throw_containing<InvalidArgument>(
      [&] { sentencepiece_tokenizer(text_path_ + ".absent", key); }, {key, "does not exist"});
}

// A program named spm_encode (or spm_export_vocab) earlier in PATH is not the one krab runs: it
// runs Debian's, by absolute path. The fake passes through to the real one, so on a krab that
// searched PATH the ids would still be right and only the fake's record would tell (with
// whether it saw the job secret and which descriptors it held).
TEST_F(SentencePieceText, ProgramsEarlierInPathAreNotRun) {
  const std::string bin = (dir_.path() / "bin").string();
  const std::string record = (dir_.path() / "fake-ran").string();
  std::filesystem::create_directories(bin);
  for (const char* name : {"spm_encode", "spm_export_vocab"}) {
    const std::string fake = bin + "/" + name;
    std::ofstream(fake) << "#!/bin/sh\n{ echo " << name
                        << " ran, job secret: ${KRAB_JOB_SECRET:+set},"
                        << " descriptors: $(ls /proc/$$/fd | tr '\\n' ' '); } >> " << record
                        << "\nexec /usr/bin/" << name << " \"$@\"\n";
    std::filesystem::permissions(fake, std::filesystem::perms::owner_all);
  }
  std::vector<int64_t> expected;
  {
    const std::string cmd =
        "/usr/bin/spm_encode --model=" + model_path_ + " --output_format=id < " + text_path_;
    std::FILE* p = popen(cmd.c_str(), "r");
    ASSERT_NE(p, nullptr);
    for (long long id; std::fscanf(p, "%lld", &id) == 1;) expected.push_back(id);
    ASSERT_EQ(pclose(p), 0);
  }
  const std::string old_path = std::getenv("PATH") ? std::getenv("PATH") : "";
  ::setenv("PATH", (bin + ":" + old_path).c_str(), 1);
  ::setenv("KRAB_JOB_SECRET", "not-for-helpers", 1);
  std::vector<int64_t> ids;
  try {
    const auto tokenizer = sentencepiece_tokenizer(model_path_, "data.tokenizer.sentencepiece");
    ids = tokenizer->encode(corpus());
  } catch (...) {
    ::setenv("PATH", old_path.c_str(), 1);
    throw;
  }
  ::setenv("PATH", old_path.c_str(), 1);
  ::unsetenv("KRAB_JOB_SECRET");
  EXPECT_EQ(ids, expected);
  EXPECT_FALSE(std::filesystem::exists(record)) << "the fake in PATH ran; it saw:\n"
                                                << core::read_file(record);
}

}  // namespace
}  // namespace krab::data
