// models::scan_script_source, inspect_torchscript_file / _bytes and check_script_graphs: what a
// TorchScript file may reach before krab runs it (script_scan.h's table, case by case), and
// that what torch.jit.save writes for ordinary networks passes.
#include "models/script_inspection.h"

#include <caffe2/serialize/inline_container.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <sstream>

#include "core/errors.h"
#include "models/model.h"
#include "models/script_scan.h"
#include "support/script_modules.h"

namespace krab::models {
namespace {

namespace fs = std::filesystem;

// The finding's "line: what: why", or "" when the source passes.
std::string scan(const std::string& source) {
  const auto f = scan_script_source(source);
  return f ? std::to_string(f->line) + ": " + f->what + ": " + f->why : "";
}

bool refused(const std::string& source, const std::string& needle) {
  const std::string s = scan(source);
  EXPECT_NE(s.find(needle), std::string::npos) << "scan of\n" << source << "\ngave: " << s;
  return !s.empty();
}

TEST(ScriptScan, RefusesEachWayToNameAFileReachingOperator) {
  EXPECT_TRUE(refused("def f(p: str):\n  return torch.from_file(p, True, 4)\n",
                      "2: torch.from_file: aten::from_file maps a file"));
  EXPECT_TRUE(refused("x = torch . \\\n  save(t, 'p')", "1: torch.save: aten::save writes a file"));
  EXPECT_TRUE(refused("x = torch.autograd.save(t, 'p')", "torch.autograd.save"));
  EXPECT_TRUE(refused("y = p.from_file(True, 4)",
                      ".from_file: a method of this name resolves "
                      "to aten::from_file"));
  EXPECT_TRUE(refused("y = (t).save('p')", ".save"));
  EXPECT_TRUE(refused("y = 1 .save('p')", ".save"));
  EXPECT_TRUE(refused("y = getattr(p, \"from_file\")(True, 4)", "\"from_file\": a string"));
  EXPECT_TRUE(refused("y = ops.c10d.send([t], pg, 0, 0)",
                      "ops.c10d.send: c10d::send is in namespace c10d::"));
  EXPECT_TRUE(refused("y = ops.myext.run(t)", "myext::run is in namespace myext::, outside"));
  EXPECT_TRUE(refused("y = ops.prim.rpc_async('w', f, ())", "prim::rpc_async calls"));
  EXPECT_TRUE(refused("f = rpc_sync('worker', g, (t,))", "rpc_sync: prim::rpc_sync calls"));
  EXPECT_TRUE(refused("v = r.to_here()", ".to_here"));
  EXPECT_TRUE(refused("s : __torch__.torch.classes.dist_c10d.FileStore",
                      "__torch__.torch.classes.dist_c10d.FileStore: a custom class"));
  // Aliases, through which any operator could be reached later.
  EXPECT_TRUE(refused("t = torch\n", "`torch` used as a value"));
  EXPECT_TRUE(refused("o = getattr(ops, 'c10d')\n", "`ops` used as a value"));
  EXPECT_TRUE(refused("c = __torch__.torch\n", "`__torch__.torch` used as a value"));
  EXPECT_TRUE(refused("c = getattr(x, 'classes')\n", "\"classes\""));
  // What cannot be read as TorchScript's lexer reads it cannot be cleared.
  EXPECT_TRUE(refused("s = 'no end\nx = torch.relu(t)", "1: a string: it does not end"));
  EXPECT_TRUE(refused("s = \"\"\"no end", "a string: it does not end"));
}

// Strings and comments are not code; names that merely contain a refused one are not it.
TEST(ScriptScan, PassesWhatIsNotCode) {
  EXPECT_EQ(scan("def forward(self, x: Tensor) -> Tensor:\n"
                 "  # torch.from_file(p) in a comment\n"
                 "  s = \"torch.save(x, 'p') in a string, \\\" escaped\"\n"
                 "  d = '''a long string\n  torch.from_file\n'''\n"
                 "  _0 = __torch__.torch.nn.functional.relu\n"
                 "  ops.prim.RaiseException(\"builtins.ValueError\")\n"
                 "  y = torch.add(self.saved, self.from_file_count)\n"
                 "  return torch.linear(x, self.weight, self.bias)\n"),
            "");
  EXPECT_EQ(scan(""), "");
  EXPECT_EQ(scan("x = 1.5e-3 + 0x1f\ny = a.owner\nz = 1if x else 2\n"), "");
  EXPECT_TRUE(refused("y = 2.5.save(\"p\")", ".save"));
}

// --- Archives ----------------------------------------------------------------------------------

class ScriptInspection : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("krab-inspect-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string save(const torch::jit::Module& m) {
    const std::string path = (dir_ / "net.ts").string();
    m.save(path);
    return path;
  }
  // An archive holding exactly `records` (name -> bytes), as PyTorch's writer lays it out.
  std::string archive(const std::vector<std::pair<std::string, std::string>>& records) {
    const std::string path = (dir_ / "forged.ts").string();
    caffe2::serialize::PyTorchStreamWriter writer(path);
    for (const auto& [name, bytes] : records) writer.writeRecord(name, bytes.data(), bytes.size());
    writer.writeEndOfFile();
    return path;
  }
  template <typename E>
  void expect_throws(const std::function<void()>& f, const std::string& needle) {
    try {
      f();
      ADD_FAILURE() << "nothing thrown; expected " << needle;
    } catch (const E& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  }

  fs::path dir_;
  test::ScriptBuilder b_;
};

// The module krab's own tests train, saved by LibTorch: nothing to refuse, in the file or in
// its graphs.
TEST_F(ScriptInspection, PassesAnOrdinaryNetwork) {
  const std::string path = save(b_.net(6, 8, 3, R"(
def predict(self, x):
    return torch.softmax(self.forward(x), -1)
)"));
  EXPECT_NO_THROW(inspect_torchscript_file(path, "net"));
  std::ifstream in(path, std::ios::binary);
  std::stringstream bytes;
  bytes << in.rdbuf();
  EXPECT_NO_THROW(inspect_torchscript_bytes(bytes.str(), "net"));
  EXPECT_NO_THROW(check_script_graphs(torch::jit::load(path), "net"));
}

// What torch.jit.script writes for most of torch.nn's layers (write_layer_zoo.py: depthwise
// and 1x1 convolutions, BatchNorm, GroupNorm, LayerNorm, squeeze-and-excitation, pooling,
// interpolation, LSTM, multi-head attention, a dozen activations) passes both steps, and the
// loaded module runs.
TEST_F(ScriptInspection, PassesWhatPythonScriptsForTorchNnLayers) {
  const std::string path = (dir_ / "zoo.ts").string();
  const std::string cmd =
      std::string(KRAB_PYTHON) + " " + KRAB_SOURCE_DIR + "/tests/models/write_layer_zoo.py " + path;
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  torch::jit::Module zoo;
  ASSERT_NO_THROW(zoo = load_inspected_torchscript_file(path, "zoo"));
  zoo.eval();
  const at::Tensor out = zoo.forward({torch::randn({2, 3, 16, 16})}).toTensor();
  EXPECT_EQ(out.sizes(), (std::vector<int64_t>{2, 10}));
}

// A forward that reaches a file: refused from the file (record, line, operator, advice) and
// from the graphs; make_model refuses it unless trust_code, and then loads it without running.
TEST_F(ScriptInspection, RefusesAForwardThatWritesAFile) {
  torch::jit::Module m = b_.module("Saver");
  m.register_module("fc", b_.linear(6, 3));
  m.define(R"(
def forward(self, x):
    y = self.fc.forward(x)
    torch.save(y, "stolen.pt")
    return y
)");
  const std::string path = save(m);
  expect_throws<InvalidArgument>([&] { inspect_torchscript_file(path, "model.path: 'n'", "ADV"); },
                                 "model.path: 'n': code/__torch__.py line ");
  expect_throws<InvalidArgument>([&] { inspect_torchscript_file(path, "n", "ADV"); },
                                 ": torch.save: aten::save writes a file; ADV");
  expect_throws<InvalidArgument>([&] { check_script_graphs(m, "n"); }, "n: __torch__.Saver");
  expect_throws<InvalidArgument>([&] { check_script_graphs(m, "n"); },
                                 ".forward runs aten::save, which writes a file");
  ModelSpec spec;
  spec.name = "torchscript";
  spec.path = path;
  expect_throws<InvalidArgument>([&] { make_model(spec); },
                                 "set model.trust_code: true to load it anyway");
  spec.trust_code = true;
  EXPECT_NE(make_model(spec), nullptr);
}

// The graph walk follows calls: a method of a TorchScript class (not a module) that forward
// calls is walked too. The file is loaded here without inspection, as model.trust_code would,
// to show that the graphs alone refuse it.
TEST_F(ScriptInspection, GraphWalkReachesMethodsOfClassesThatForwardCalls) {
  const std::string path = (dir_ / "helper.ts").string(), target = (dir_ / "target").string();
  const std::string cmd = std::string(KRAB_PYTHON) + " " + KRAB_SOURCE_DIR +
                          "/tests/models/write_file_reaching_module.py " + target + " " + path +
                          " helper";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  expect_throws<InvalidArgument>([&] { inspect_torchscript_file(path, "h"); },
                                 "h: code/__torch__/payload_module.py line ");
  const torch::jit::Module m = torch::jit::load(path);
  expect_throws<InvalidArgument>(
      [&] { check_script_graphs(m, "h"); },
      "h: __torch__.payload_module.Helper.touch runs aten::from_file, which maps a file");
  EXPECT_FALSE(fs::exists(target));
}

TEST_F(ScriptInspection, RefusesWhatIsNotAModernTorchScriptArchive) {
  const std::string text = (dir_ / "text.ts").string();
  std::ofstream(text) << "def forward(self, x):\n  return x\n";
  expect_throws<InvalidArgument>([&] { inspect_torchscript_file(text, "t"); },
                                 "t is not a TorchScript module (not a zip archive");
  expect_throws<InvalidArgument>(
      [&] {
        inspect_torchscript_file(archive({{"model.json", "{}"}, {"code/x.py", ""}}), "t");
      },
      "t is in the TorchScript format of PyTorch before 1.5 (model.json)");
  expect_throws<InvalidArgument>(
      [&] {
        inspect_torchscript_file(archive({{"code/__torch__.py", "x = 1\n"}}), "t");
      },
      "t is not a TorchScript module (no data.pkl record");
  std::ifstream in(save(b_.net(6, 8, 3)), std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  bytes.resize(bytes.size() - 30);  // the end of the zip directory cut off
  expect_throws<CorruptData>([&] { inspect_torchscript_bytes(bytes, "t"); },
                             "t: damaged TorchScript archive");
}

// LibTorch finds records by a case-blind name, and torch.package keeps source elsewhere than
// code/: every record whose name ends in .py, in any case, is scanned.
TEST_F(ScriptInspection, ScansEverySourceRecordLibTorchCouldRead) {
  expect_throws<InvalidArgument>(
      [&] {
        inspect_torchscript_file(
            archive(
                {{"data.pkl", "N."}, {"code/__torch__/Net.PY", "x = 1\ny = torch.save(x, 'p')\n"}}),
            "t");
      },
      "t: code/__torch__/Net.PY line 2: torch.save");
  expect_throws<InvalidArgument>(
      [&] {
        inspect_torchscript_file(
            archive({{"data.pkl", "N."}, {".data/ts_code/code/__torch__.py", "ops.c10d.barrier"}}),
            "t");
      },
      "t: .data/ts_code/code/__torch__.py line 1: ops.c10d.barrier");
}

// torch.jit.save deflates source records; LibTorch allocates a deflated record's stated size
// before inflating it, so a size that the compressed bytes cannot hold is refused first.
TEST_F(ScriptInspection, RefusesADeflatedRecordStatingMoreThanItsBytesCanHold) {
  const std::string path = (dir_ / "deflated.ts").string();
  {
    caffe2::serialize::PyTorchStreamWriter writer(path);
    const std::string code(4000, '\n');
    writer.writeRecord("data.pkl", "N.", 2);
    writer.writeRecord("code/__torch__.py", code.data(), code.size(), /*compress=*/true);
    writer.writeEndOfFile();
  }
  std::ifstream in(path, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_NO_THROW(inspect_torchscript_bytes(bytes, "t"));
  // The central directory entry's uncompressed size (offset 24) says 2 GiB - 1.
  const std::string entry = std::string("PK\x01\x02", 4);
  for (size_t at = bytes.find(entry); at != std::string::npos; at = bytes.find(entry, at + 4))
    if (bytes.compare(at + 46, 26, "deflated/code/__torch__.py") == 0)
      for (int i = 0; i < 4; ++i) bytes[at + 24 + i] = static_cast<char>(0x7fffffffu >> (8 * i));
  expect_throws<CorruptData>([&] { inspect_torchscript_bytes(bytes, "t"); },
                             "t: damaged TorchScript archive: record deflated/code/__torch__.py "
                             "states 2147483647 bytes inflated from ");
}

// Pickles are walked too: a global naming a custom class (whose C++ __setstate__ would run while
// the file loads) or one that cannot be read without running the pickle is refused.
TEST_F(ScriptInspection, RefusesPicklesNamingCustomClasses) {
  const std::string custom =
      std::string("\x80\x02") + "c__torch__.torch.classes.dist_c10d\n" + "FileStore\n)\x81.";
  expect_throws<InvalidArgument>(
      [&] {
        inspect_torchscript_file(archive({{"data.pkl", custom}}), "t", "ADV");
      },
      "t: data.pkl: names the custom class __torch__.torch.classes.dist_c10d.FileStore");
  const std::string stack_global = std::string("\x80\x04\x8c\x01m\x8c\x01n\x93.");
  expect_throws<InvalidArgument>(
      [&] {
        inspect_torchscript_file(archive({{"data.pkl", "N."}, {"constants.pkl", stack_global}}),
                                 "t");
      },
      "t: constants.pkl: a STACK_GLOBAL opcode");
  expect_throws<CorruptData>(
      [&] {
        inspect_torchscript_file(archive({{"data.pkl", "\x80\x02q"}}), "t");
      },
      "t: damaged pickle (data.pkl)");
}

}  // namespace
}  // namespace krab::models
