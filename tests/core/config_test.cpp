// Tests for the configuration registry: defaults, parsing, overrides, every class of user
// error, round trips, and docs/config.md staying in sync with the registry.
#include "core/config.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <set>
#include <sstream>

#include "core/errors.h"

namespace krab::core {
namespace {

// Runs `fn`, expects InvalidArgument, and returns its message.
std::string invalid_message(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const InvalidArgument& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "expected InvalidArgument, got another exception: " << e.what();
    return "";
  }
  ADD_FAILURE() << "expected InvalidArgument, nothing was thrown";
  return "";
}

std::string parse_error(const std::string& yaml, const std::vector<std::string>& overrides = {}) {
  return invalid_message([&] { Config::parse(yaml, "job.yaml", overrides); });
}

#define EXPECT_CONTAINS(haystack, needle)                          \
  EXPECT_NE(std::string(haystack).find(needle), std::string::npos) \
      << "expected to find \"" << (needle) << "\" in:\n  " << (haystack)

TEST(ConfigRegistry, IsWellFormed) {
  std::set<std::string> keys;
  for (const KeySpec& spec : registry()) {
    EXPECT_TRUE(keys.insert(spec.key).second) << spec.key;
    EXPECT_FALSE(spec.doc.empty()) << spec.key;
    EXPECT_EQ(spec.doc.back(), '.') << spec.key << ": docs are one sentence";
    if (spec.type != KeyType::kString) {
      EXPECT_TRUE(spec.choices.empty()) << spec.key;
    }
    if (spec.type == KeyType::kString || spec.type == KeyType::kBool) {
      EXPECT_FALSE(spec.min || spec.max) << spec.key;
    }
    EXPECT_EQ(find_key(spec.key), &spec);
  }
  EXPECT_EQ(keys.size(), 159u);  // update when a key is added
  EXPECT_EQ(find_key("train"), nullptr);
  EXPECT_EQ(find_key("nope"), nullptr);
}

TEST(ConfigDefaults, MatchTheRegistry) {
  Config c = Config::defaults();
  EXPECT_EQ(c.get_string("name"), "");
  EXPECT_EQ(c.get_string("model.name"), "cnn");
  EXPECT_EQ(c.get_int("model.hidden"), 128);
  EXPECT_EQ(c.get_int("model.width"), 128);
  EXPECT_EQ(c.get_string("data.name"), "fashion-mnist");
  EXPECT_EQ(c.get_string("data.path"), "/usr/share/datasets/fashion-mnist");
  EXPECT_TRUE(c.get_bool("data.normalize"));
  EXPECT_DOUBLE_EQ(c.get_float("data.test_fraction"), 0.1);
  EXPECT_EQ(c.get_int("train.epochs"), 1);
  EXPECT_EQ(c.get_string("train.optimizer.name"), "sgd");
  EXPECT_DOUBLE_EQ(c.get_float("train.optimizer.lr"), 0.05);
  EXPECT_DOUBLE_EQ(c.get_float("train.optimizer.momentum"), 0.9);
  EXPECT_EQ(c.get_int("parallel.workers"), 4);
  EXPECT_DOUBLE_EQ(c.get_float("parallel.bucket_mb"), 25);
  EXPECT_EQ(c.get_string("comm.backend"), "gloo");
  EXPECT_DOUBLE_EQ(c.get_float("comm.timeout_s"), 60);
  EXPECT_FALSE(c.get_bool("comm.debug_checks"));
  EXPECT_EQ(c.get_string("comm.iface"), "");
  EXPECT_EQ(c.get_string("checkpoint.dir"), "runs/{name}");
  EXPECT_EQ(c.get_int("checkpoint.keep"), 2);
  for (const KeySpec& spec : registry()) EXPECT_FALSE(c.is_set(spec.key)) << spec.key;
  EXPECT_EQ(c, Config());
}

TEST(ConfigParse, EmptyAndNullDocumentsAreDefaults) {
  for (const char* text : {"", "\n", "# just a comment\n", "~", "null\n", "---\n"})
    EXPECT_EQ(Config::parse(text, "job.yaml"), Config::defaults()) << "'" << text << "'";
  // A section with nothing under it is an empty section.
  EXPECT_EQ(Config::parse("train:\nmodel: ~\n", "job.yaml"), Config::defaults());
}

TEST(ConfigParse, NestedSections) {
  Config c = Config::parse(R"(
name: my-job
model:
  name: gpt
  layers: 3
train:
  epochs: 5
  optimizer:
    name: adamw
    lr: 3e-4
    weight_decay: 1   # an int is fine for a float key
data:
  normalize: off
)",
                           "job.yaml");
  EXPECT_EQ(c.get_string("name"), "my-job");
  EXPECT_EQ(c.get_string("model.name"), "gpt");
  EXPECT_EQ(c.get_int("model.layers"), 3);
  EXPECT_EQ(c.get_int("train.epochs"), 5);
  EXPECT_EQ(c.get_string("train.optimizer.name"), "adamw");
  EXPECT_DOUBLE_EQ(c.get_float("train.optimizer.lr"), 3e-4);
  EXPECT_DOUBLE_EQ(c.get_float("train.optimizer.weight_decay"), 1.0);
  EXPECT_FALSE(c.get_bool("data.normalize"));
  EXPECT_TRUE(c.is_set("train.optimizer.lr"));
  EXPECT_FALSE(c.is_set("train.optimizer.momentum"));
  EXPECT_EQ(c.get_int("model.width"), 128);  // untouched keys keep their defaults
}

TEST(ConfigParse, DottedKeysAndFlowStyle) {
  Config c = Config::parse("train.optimizer.lr: 0.5\ntrain: {optimizer.name: adam, seed: 7}\n",
                           "job.yaml");
  EXPECT_DOUBLE_EQ(c.get_float("train.optimizer.lr"), 0.5);
  EXPECT_EQ(c.get_string("train.optimizer.name"), "adam");
  EXPECT_EQ(c.get_int("train.seed"), 7);
}

TEST(ConfigParse, ListKeysTakeYamlListsAsCommaSeparatedText) {
  const Config c =
      Config::parse("data: {size: [32, 24], mean: [0.485, 0.456, 0.406], std: 0.5}\n", "job.yaml");
  EXPECT_EQ(c.get_string("data.size"), "32,24");
  EXPECT_EQ(c.get_string("data.mean"), "0.485,0.456,0.406");
  EXPECT_EQ(c.get_string("data.std"), "0.5");
  // The override spelling, and the text forms the readers always took.
  EXPECT_EQ(Config::parse("", "job.yaml", {"data.size=[28, 28]"}).get_string("data.size"), "28,28");
  EXPECT_EQ(Config::parse("data: {size: 28x28}", "job.yaml").get_string("data.size"), "28x28");
  // The joined text survives the YAML round trip the federated client relies on.
  EXPECT_EQ(Config::parse(c.to_yaml(), "again.yaml").get_string("data.mean"), "0.485,0.456,0.406");
  // Lists of lists or empty lists are refused, naming the key; non-list keys still refuse lists.
  EXPECT_CONTAINS(parse_error("data: {size: [[1, 2], 3]}"),
                  "data.size: expected a list of numbers or words, got a list in it");
  EXPECT_CONTAINS(parse_error("data: {mean: []}"), "data.mean: expected a list");
  EXPECT_CONTAINS(parse_error("data: {path: [a, b]}"),
                  "data.path: expected a string value, got a list");
}

TEST(ConfigParse, ValueSpellings) {
  for (const char* t : {"true", "yes", "on", "True", "YES"})
    EXPECT_TRUE(Config::parse(std::string("comm:\n  debug_checks: ") + t, "j")
                    .get_bool("comm.debug_checks"))
        << t;
  for (const char* f : {"false", "no", "off", "False", "OFF"})
    EXPECT_FALSE(
        Config::parse(std::string("data:\n  normalize: ") + f, "j").get_bool("data.normalize"))
        << f;
  EXPECT_DOUBLE_EQ(
      Config::parse("train: {optimizer: {lr: 1}}", "j").get_float("train.optimizer.lr"), 1.0);
  EXPECT_DOUBLE_EQ(
      Config::parse("train: {optimizer: {lr: 1e-3}}", "j").get_float("train.optimizer.lr"), 1e-3);
  EXPECT_EQ(Config::parse("train: {steps: +12}", "j").get_int("train.steps"), 12);
  // Strings keep their text, whatever YAML would otherwise read it as; null is "".
  EXPECT_EQ(Config::parse("name: yes", "j").get_string("name"), "yes");
  EXPECT_EQ(Config::parse("name: 123", "j").get_string("name"), "123");
  EXPECT_EQ(Config::parse("comm: {iface: }", "j").get_string("comm.iface"), "");
  EXPECT_EQ(Config::parse("name: \"a: b\"", "j").get_string("name"), "a: b");
}

TEST(ConfigOverrides, WinOverTheFile) {
  Config c = Config::parse("train:\n  epochs: 5\nparallel: {workers: 2}\n", "job.yaml",
                           {"train.epochs=7", "train.optimizer.lr=0.2", "data.normalize=no",
                            "parallel.workers=3", "parallel.workers = 8"});
  EXPECT_EQ(c.get_int("train.epochs"), 7);
  EXPECT_DOUBLE_EQ(c.get_float("train.optimizer.lr"), 0.2);
  EXPECT_FALSE(c.get_bool("data.normalize"));
  EXPECT_EQ(c.get_int("parallel.workers"), 8);  // the later override wins
  EXPECT_TRUE(c.is_set("train.optimizer.lr"));
  EXPECT_EQ(Config::parse("", "j", {"checkpoint.dir=a=b"}).get_string("checkpoint.dir"), "a=b");
  EXPECT_EQ(Config::parse("", "j", {"comm.iface="}).get_string("comm.iface"), "");
}

TEST(ConfigOverrides, BadSyntax) {
  for (const char* bad : {"train.epochs", "=3", " =3", ""}) {
    std::string msg = parse_error("", {bad});
    EXPECT_CONTAINS(msg, "--set '" + std::string(bad) + "'");
    EXPECT_CONTAINS(msg, "KEY=VALUE");
  }
  std::string msg = parse_error("", {"train=3"});
  EXPECT_CONTAINS(msg, "'train' is a section");
  EXPECT_CONTAINS(msg, "train.epochs");
  msg = parse_error("", {"train.epochs=many"});
  EXPECT_CONTAINS(msg, "--set 'train.epochs=many'");
  EXPECT_CONTAINS(msg, "expected an int, got 'many'");
}

TEST(ConfigErrors, UnknownKeySuggestsTheClosest) {
  std::string msg = parse_error("model:\n  name: cnn\ntrain:\n  epoch: 3\n");
  EXPECT_CONTAINS(msg, "job.yaml:4:3: ");
  EXPECT_CONTAINS(msg, "unknown key 'train.epoch'");
  EXPECT_CONTAINS(msg, "did you mean 'train.epochs'?");

  EXPECT_CONTAINS(parse_error("trian: {epochs: 1}"), "did you mean 'train.epochs'?");
  EXPECT_CONTAINS(parse_error("train: {lr: 0.1}"), "did you mean 'train.optimizer.lr'?");
  EXPECT_CONTAINS(parse_error("lr: 0.1"), "did you mean 'train.optimizer.lr'?");
  EXPECT_CONTAINS(parse_error("", {"parallel.worker=2"}), "did you mean 'parallel.workers'?");

  // Nothing close: no guess, but the section's keys are listed.
  msg = parse_error("comm:\n  transport: rdma\n");
  EXPECT_CONTAINS(msg, "unknown key 'comm.transport'");
  EXPECT_EQ(msg.find("did you mean"), std::string::npos) << msg;
  EXPECT_CONTAINS(msg, "comm.backend");
  EXPECT_CONTAINS(parse_error("zzzzzzzz: {}"), "unknown key 'zzzzzzzz'");
}

TEST(ConfigErrors, WrongType) {
  std::string msg = parse_error("train:\n  epochs: 1.5\n");
  EXPECT_CONTAINS(msg, "job.yaml:2:11: ");
  EXPECT_CONTAINS(msg, "train.epochs: expected an int, got '1.5'");
  for (const char* v : {"1e3", "3.0", "ten", "0x10", "+-1", "--1", "-"})
    EXPECT_CONTAINS(parse_error(std::string("train: {epochs: ") + v + "}"),
                    "expected an int, got '" + std::string(v) + "'");
  EXPECT_CONTAINS(parse_error("train: {steps: 99999999999999999999}"), "out of range");
  for (const char* v : {"fast", "nan", ".inf", "1e", "0x1p3"})
    EXPECT_CONTAINS(parse_error(std::string("train: {optimizer: {lr: ") + v + "}}"),
                    "train.optimizer.lr: expected a float, got '" + std::string(v) + "'");
  EXPECT_CONTAINS(parse_error("data: {normalize: maybe}"),
                  "data.normalize: expected a bool (true/false, yes/no, on/off), got 'maybe'");
  EXPECT_CONTAINS(parse_error("train: {epochs: }"),
                  "train.epochs: expected an int value, got no "
                  "value");
}

TEST(ConfigErrors, ShapeMismatch) {
  std::string msg = parse_error("train:\n  epochs:\n    a: 1\n");
  EXPECT_CONTAINS(msg, "train.epochs: expected an int value, got a mapping");
  EXPECT_CONTAINS(parse_error("model: {name: [cnn, gpt]}"),
                  "model.name: expected a string value, got a list");
  msg = parse_error("train: 3\n");
  EXPECT_CONTAINS(msg, "'train' is a section");
  EXPECT_CONTAINS(msg, "got '3'");
  EXPECT_CONTAINS(parse_error("train:\n  optimizer: sgd\n"), "'train.optimizer' is a section");
  EXPECT_CONTAINS(parse_error("- a\n- b\n"), "top level must be a mapping");
  EXPECT_CONTAINS(parse_error("hello\n"), "top level must be a mapping");
  EXPECT_CONTAINS(parse_error("[a]: 1\n"), "keys must be plain names");
}

TEST(ConfigErrors, DuplicateKeys) {
  std::string msg = parse_error("train:\n  epochs: 1\n  epochs: 2\n");
  EXPECT_CONTAINS(msg, "job.yaml:3:3: duplicate key 'train.epochs'");
  EXPECT_CONTAINS(parse_error("train: {epochs: 1}\ntrain: {seed: 2}\n"), "duplicate key 'train'");
  msg = parse_error("train.epochs: 1\ntrain: {epochs: 2}\n");
  EXPECT_CONTAINS(msg, "duplicate key 'train.epochs' (first given at job.yaml:1:1)");
}

TEST(ConfigErrors, ChoicesAreListed) {
  std::string msg = parse_error("model:\n  name: resnet\n");
  EXPECT_CONTAINS(msg, "job.yaml:2:9: ");
  EXPECT_CONTAINS(msg, "model.name: must be one of mlp, cnn, gpt, torchscript; got 'resnet'");
  EXPECT_CONTAINS(parse_error("", {"comm.backend=nccl"}), "must be one of gloo, mpi; got 'nccl'");
}

TEST(ConfigErrors, Bounds) {
  EXPECT_CONTAINS(parse_error("parallel: {workers: 0}"), "parallel.workers: must be >= 1, got 0");
  EXPECT_CONTAINS(parse_error("parallel: {workers: -1}"), "parallel.workers: must be >= 1, got -1");
  EXPECT_CONTAINS(parse_error("", {"data.test_fraction=0.95"}),
                  "data.test_fraction: must be between 0 and 0.9, got 0.95");
  EXPECT_CONTAINS(parse_error("comm: {timeout_s: 0.05}"), "must be >= 0.1, got 0.05");
  // Bounds are inclusive.
  Config c = Config::parse("train: {optimizer: {momentum: 1}}\ndata: {test_fraction: 0}\n", "j",
                           {"comm.timeout_s=0.1", "parallel.workers=1"});
  EXPECT_DOUBLE_EQ(c.get_float("train.optimizer.momentum"), 1.0);
  EXPECT_EQ(c.get_int("parallel.workers"), 1);
}

TEST(ConfigErrors, MalformedYamlHasThePosition) {
  std::string msg = parse_error("train:\n  epochs: 3\n  seed: [1, 2\nmodel: {}\n");
  EXPECT_CONTAINS(msg, "job.yaml:");
  EXPECT_CONTAINS(msg, "malformed YAML");
  EXPECT_TRUE(msg.find("job.yaml:3:") != std::string::npos ||
              msg.find("job.yaml:4:") != std::string::npos)
      << msg;
  msg = parse_error("train:\n  epochs: 3\n bad: 1\n");
  EXPECT_CONTAINS(msg, "job.yaml:3:");
}

TEST(ConfigLoadFile, NameComesFromTheStem) {
  namespace fs = std::filesystem;
  fs::path dir = fs::path(testing::TempDir()) / "krab_config_test";
  fs::create_directories(dir);
  fs::path job = dir / "mnist-small.yaml";
  std::ofstream(job) << "train:\n  epochs: 2\n";

  Config c = Config::load_file(job.string());
  EXPECT_EQ(c.get_string("name"), "mnist-small");
  EXPECT_FALSE(c.is_set("name"));
  EXPECT_EQ(c.get_int("train.epochs"), 2);
  EXPECT_EQ(Config::load_file(job.string(), {"name=other"}).get_string("name"), "other");

  std::ofstream(job) << "name: explicit\ntrain:\n  epoch: 2\n";
  std::string msg = invalid_message([&] { Config::load_file(job.string()); });
  EXPECT_CONTAINS(msg, job.string() + ":3:3: unknown key 'train.epoch'");

  std::string missing = (dir / "nope.yaml").string();
  EXPECT_CONTAINS(invalid_message([&] { Config::load_file(missing); }), missing);
  EXPECT_CONTAINS(invalid_message([&] { Config::load_file(dir.string()); }), dir.string());
  fs::remove_all(dir);
}

TEST(ConfigAccess, GettersAndSet) {
  Config c;
  EXPECT_DOUBLE_EQ(c.get_float("train.epochs"), 1.0);  // ints read as floats
  EXPECT_THROW(c.get_int("train.optimizer.lr"), Error);
  EXPECT_THROW(c.get_string("train.epochs"), Error);
  EXPECT_THROW(c.get_bool("no.such.key"), Error);
  EXPECT_THROW(c.is_set("no.such.key"), Error);
  try {
    c.get_int("train.optimizer.lr");
  } catch (const InvalidArgument&) {
    ADD_FAILURE() << "a getter mismatch is a programming error, not the user's";
  } catch (const Error&) {
  }

  c.set("model.name", "mlp");
  EXPECT_EQ(c.get_string("model.name"), "mlp");
  EXPECT_TRUE(c.is_set("model.name"));
  EXPECT_CONTAINS(invalid_message([&] { c.set("model.name", "vgg"); }), "got 'vgg'");
  EXPECT_CONTAINS(invalid_message([&] { c.set("model.nam", "mlp"); }),
                  "did you mean 'model.name'?");
  EXPECT_EQ(c.get_string("model.name"), "mlp");  // a failed set leaves the value alone
}

TEST(ConfigSerialise, JsonIsNested) {
  Config c = Config::parse("train: {optimizer: {lr: 0.25}, epochs: 3}", "j");
  nlohmann::json j = c.to_json();
  EXPECT_EQ(j["name"], "");
  EXPECT_EQ(j["train"]["epochs"], 3);
  EXPECT_TRUE(j["train"]["epochs"].is_number_integer());
  EXPECT_DOUBLE_EQ(j["train"]["optimizer"]["lr"].get<double>(), 0.25);
  EXPECT_EQ(j["data"]["normalize"], true);
  EXPECT_EQ(j["model"]["name"], "cnn");
}

TEST(ConfigSerialise, YamlRoundTrips) {
  Config c = Config::parse(R"(
name: "yes"
model: {name: gpt, heads: 8}
data: {path: "/tmp/a: b #c 'q' \"dq\"", test_fraction: 0.3, normalize: false}
train: {optimizer: {lr: 0.1, momentum: 0}, seed: 123456789012}
comm: {iface: "", timeout_s: 1e-1}
)",
                           "j");
  std::string yaml = c.to_yaml();
  Config back = Config::parse(yaml, "to_yaml");
  EXPECT_EQ(back, c) << yaml;
  EXPECT_EQ(back.to_json(), c.to_json()) << yaml;
  EXPECT_EQ(back.get_string("name"), "yes");
  EXPECT_EQ(Config::parse(Config().to_yaml(), "to_yaml"), Config());
  EXPECT_NE(c, Config());
}

TEST(ConfigDocs, ExampleJobParses) {
  std::string md = render_markdown();
  size_t begin = md.find("```yaml\n");
  ASSERT_NE(begin, std::string::npos);
  begin += 8;
  size_t end = md.find("```", begin);
  Config c = Config::parse(md.substr(begin, end - begin), "docs example");
  EXPECT_TRUE(c.is_set("train.optimizer.lr"));
  for (const KeySpec& spec : registry()) EXPECT_CONTAINS(md, "`" + spec.key + "`");
}

// docs/config.md is checked in so it can be read on GitHub; it must be what the registry says.
TEST(ConfigDocs, CheckedInFileMatchesTheRegistry) {
  const std::string path = std::string(KRAB_SOURCE_DIR) + "/docs/config.md";
  const std::string expected = render_markdown();
  if (const char* regen = std::getenv("KRAB_REGENERATE_DOCS"); regen && *regen == '1') {
    std::ofstream(path, std::ios::binary) << expected;
  }
  std::ifstream in(path, std::ios::binary);
  std::stringstream actual;
  actual << in.rdbuf();
  EXPECT_TRUE(actual.str() == expected)
      << path << " is out of date with the registry in src/core/config_keys.cpp.\n"
      << "Regenerate it with: KRAB_REGENERATE_DOCS=1 <build>/bin/core_config_test "
         "--gtest_filter='*Docs*'";
}

// Every job file shipped in examples/ parses against the registry (the README points to them).
TEST(ConfigExamples, AllParse) {
  int seen = 0;
  for (const auto& e :
       std::filesystem::directory_iterator(std::string(KRAB_SOURCE_DIR) + "/examples")) {
    if (e.path().extension() != ".yaml") continue;
    ++seen;
    EXPECT_NO_THROW(Config::load_file(e.path().string())) << e.path();
  }
  EXPECT_GE(seen, 3);
}

// Found by tests/fuzz/fuzz_config: --set text was quoted raw in messages, and a string value
// that is not UTF-8 came back changed from to_yaml() (the emitter writes U+FFFD for the bad
// bytes), so a federated client would have run with another value than the server.
TEST(ConfigFuzzFindings, OverrideBytesAreEscapedInMessages) {
  const std::string msg = parse_error("", {std::string("\x07train.epochs\x1b=3")});
  EXPECT_CONTAINS(msg, "\\x07train.epochs\\x1b=3");
  EXPECT_EQ(msg.find('\x1b'), std::string::npos) << msg;
}

// Found by fuzz_config: the section a bad key sits in was quoted raw.
TEST(ConfigFuzzFindings, TheSectionOfABadKeyIsEscaped) {
  const std::string msg = parse_error("x\x1btrain:\n  ? [a]\n  : 1\n");
  EXPECT_CONTAINS(msg, "keys must be plain names, got a list in 'x\\x1btrain'");
  EXPECT_EQ(msg.find('\x1b'), std::string::npos) << msg;
}

TEST(ConfigFuzzFindings, AStringThatIsNotUtf8IsRefused) {
  const std::string msg = parse_error("name: run\xd7\xd7\n");
  EXPECT_CONTAINS(msg, "job.yaml:1:7: ");
  EXPECT_CONTAINS(msg, "name: 'run\\xd7\\xd7' is not valid UTF-8");
  EXPECT_CONTAINS(parse_error("", {"comm.iface=/tmp/\xc0\xaf"}),
                  "not valid UTF-8");  // overlong '/'
  const Config ok = Config::parse("name: caf\xc3\xa9-\xe2\x82\xac\n", "job.yaml");
  EXPECT_EQ(Config::parse(ok.to_yaml(), "again"), ok);
  EXPECT_EQ(ok.get_string("name"), "caf\xc3\xa9-\xe2\x82\xac");
}

// A path is bytes on Linux (issue 25): path keys take any bytes but NUL, from the file and
// from --set alike; other strings stay UTF-8.
TEST(ConfigPaths, PathKeysTakeAnyBytesButNul) {
  EXPECT_EQ(Config::parse("data: {path: /d/caf\xe9.csv}\n", "job.yaml").get_string("data.path"),
            "/d/caf\xe9.csv");
  EXPECT_EQ(
      Config::parse("", "job.yaml", {"checkpoint.dir=/r/\xc0\xaf"}).get_string("checkpoint.dir"),
      "/r/\xc0\xaf");
  const std::string nul = parse_error("data: {path: \"/d/a\\0b\"}\n");
  EXPECT_CONTAINS(nul, "data.path: '/d/a\\x00b' holds a NUL byte");
  EXPECT_CONTAINS(parse_error("name: run\xe9\n"), "is not valid UTF-8");
  for (const char* key :
       {"model.path", "data.path", "data.test_path", "data.tokenizer.sentencepiece",
        "checkpoint.dir", "checkpoint.hmac_key_file", "federated.tls_cert", "federated.tls_key",
        "federated.tls_client_ca", "federated.tokens", "federated.eval_data"})
    EXPECT_TRUE(find_key(key)->path) << key;
  EXPECT_FALSE(find_key("comm.iface")->path);
}

// Found by tests/fuzz/fuzz_config (CI, stop 31): a path that is not UTF-8 came back from
// to_yaml() with U+FFFD for its bad bytes. It is written as !!binary and read back exactly.
TEST(ConfigPaths, APathThatIsNotUtf8SurvivesToYaml) {
  const Config c = Config::parse(
      "federated: {tls_cert: \"serve\xff\xd1\x8f\xfem\"}\ndata: {path: /d/caf\xe9.csv}\n",
      "job.yaml");
  const std::string yaml = c.to_yaml();
  EXPECT_CONTAINS(yaml, "tls_cert: !!binary \"c2VydmX/0Y/+bQ==\"");
  const Config back = Config::parse(yaml, "to_yaml");
  EXPECT_EQ(back, c);
  EXPECT_EQ(back.get_string("federated.tls_cert"), "serve\xff\xd1\x8f\xfem");
  EXPECT_EQ(back.get_string("data.path"), "/d/caf\xe9.csv");
  // !!binary gives bytes, which are checked as any text: a non-path key still wants UTF-8.
  EXPECT_EQ(Config::parse("name: !!binary \"cnVu\"\n", "job.yaml").get_string("name"), "run");
  EXPECT_CONTAINS(parse_error("name: !!binary \"cnVu1w==\"\n"), "is not valid UTF-8");
  EXPECT_CONTAINS(parse_error("data: {path: !!binary \"%%%\"}\n"),
                  "data.path: !!binary value is not base64: '%%%'");
  EXPECT_CONTAINS(parse_error("train: {epochs: !!binary \"Mw==\"}\n"),
                  "train.epochs: !!binary is for text values, and this key takes an int");
}

// Relative paths written in a job file are relative to the file's folder; --set's to the
// current directory; defaults and absolute paths stay as they are. parse() anchors nothing.
TEST(ConfigPaths, LoadFileAnchorsRelativePathsToTheJobFilesFolder) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::absolute(fs::path(testing::TempDir()) / "krab_config_paths");
  fs::create_directories(dir / "jobs");
  const fs::path job = dir / "jobs" / "j.yaml";
  std::ofstream(job) << "model: {path: ../nets/n.ts}\ndata: {path: d.csv, test_path: /abs/t.csv}"
                        "\ncheckpoint: {dir: 'out/{name}'}\n";
  const Config c = Config::load_file(job.string(), {"data.tokenizer.sentencepiece=s.model"});
  EXPECT_EQ(c.get_string("model.path"), (dir / "nets" / "n.ts").string());
  EXPECT_EQ(c.get_string("data.path"), (dir / "jobs" / "d.csv").string());
  EXPECT_EQ(c.get_string("data.test_path"), "/abs/t.csv");
  EXPECT_EQ(c.get_string("checkpoint.dir"), (dir / "jobs" / "out" / "{name}").string());
  EXPECT_EQ(c.get_string("data.tokenizer.sentencepiece"),
            (fs::current_path() / "s.model").string());
  EXPECT_EQ(c.get_string("checkpoint.hmac_key_file"), "");  // empty: none, not the folder
  EXPECT_EQ(Config::load_file(job.string(), {"data.path=x.csv"}).get_string("data.path"),
            (fs::current_path() / "x.csv").string());
  std::ofstream(job) << "train: {epochs: 1}\n";
  EXPECT_EQ(Config::load_file(job.string()).get_string("checkpoint.dir"), "runs/{name}");
  EXPECT_EQ(Config::parse("data: {path: d.csv}\n", "j").get_string("data.path"), "d.csv");
  fs::remove_all(dir);
}

}  // namespace
}  // namespace krab::core
