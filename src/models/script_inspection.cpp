#include "models/script_inspection.h"

#include <caffe2/serialize/inline_container.h>
#include <torch/csrc/jit/api/function_impl.h>
#include <torch/csrc/jit/ir/ir.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <set>
#include <sstream>

#include "core/archive_walk.h"
#include "core/errors.h"
#include "core/printable.h"
#include "models/script_scan.h"

namespace krab::models {
namespace {

using caffe2::serialize::PyTorchStreamReader;

constexpr const char* kArchive = "TorchScript archive";
// torch.jit.save deflates its source and debug records: a large network's code is a few MB.
constexpr uint64_t kMaxInflated = uint64_t{64} << 20;
constexpr const char* kSaveOne = "save one from Python with torch.jit.script(model).save(path)";

// Who is inspecting: the file's name for messages, and what a refusal advises.
struct Reader {
  const std::string& source;
  const std::string& advice;

  [[noreturn]] void refuse(const std::string& what) const {
    throw InvalidArgument(str_cat(source, ": ", what, advice.empty() ? "" : "; ", advice));
  }
};

std::string one_line(std::string s) {
  for (char& ch : s)
    if (ch == '\n' || ch == '\r') ch = ' ';
  return core::printable(s, 300);
}

// LibTorch's message as one printable line.
std::string first_line(const std::string& s) {
  return core::printable(s.substr(0, s.find('\n')), 300);
}

std::string lowercase(std::string s) {
  for (char& c : s)
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  return s;
}

bool ends_with(const std::string& s, const char* tail) {
  const size_t n = std::strlen(tail);
  return s.size() >= n && s.compare(s.size() - n, n, tail) == 0;
}

std::string record_bytes(PyTorchStreamReader& reader, const std::string& name,
                         const std::string& source) {
  try {
    auto [data, size] = reader.getRecord(name);
    return std::string(static_cast<const char*>(data.get()), size);
  } catch (const c10::Error& e) {
    throw CorruptData(str_cat(source, ": damaged ", kArchive, " (record ",
                              core::printable(name, 80),
                              "): ", one_line(e.what_without_backtrace())));
  }
}

// A pickle's globals are resolved by LibTorch's unpickler: builtins and torch's rebuild
// functions by name, the archive's own classes (__torch__.*) from its source, which is scanned,
// and custom classes (__torch__.torch.classes.*) from C++, whose __setstate__ runs while the
// file loads. STACK_GLOBAL takes its names from the stack, where the walk cannot read them;
// PyTorch's pickler never writes it.
void check_globals(const std::string& pickle, const std::string& record, const Reader& r) {
  core::check_pickle(pickle.data(), pickle.size(), r.source, record,
                     [&](const core::PickleGlobal& g) {
                       if (g.is_stack_global)
                         r.refuse(str_cat(record,
                                          ": a STACK_GLOBAL opcode (PyTorch writes GLOBAL; krab "
                                          "cannot tell which class it names)"));
                       if (g.module.find("torch.classes") != std::string::npos ||
                           g.name.find("torch.classes") != std::string::npos)
                         r.refuse(str_cat(record, ": names the custom class ",
                                          core::printable(g.module + "." + g.name, 120),
                                          ", which runs C++ code of its own while the file loads"));
                     });
}

// The archive read from `in` (`size` bytes), checked as the header says.
void inspect_archive(std::istream& in, uint64_t size, const Reader& r) {
  const std::string& source = r.source;
  char magic[4] = {};
  KRAB_CHECK_ARG(in.read(magic, 4) && std::memcmp(magic, "PK\x03\x04", 4) == 0, source,
                 " is not a TorchScript module (not a zip archive; ", kSaveOne, ")");
  in.clear();
  const core::ArchiveRecords records =
      core::check_zip_directory(in, size, source, kArchive, kMaxInflated);
  std::set<std::string> names;
  for (const auto& record : records) names.insert(lowercase(record.first));
  KRAB_CHECK_ARG(names.count("model.json") == 0, source,
                 " is in the TorchScript format of PyTorch before 1.5 (model.json), which krab "
                 "does not read; load and save it again with a recent torch.jit");
  KRAB_CHECK_ARG(records.count("data.pkl") == 1, source,
                 " is not a TorchScript module (no data.pkl record; ", kSaveOne, ")");
  in.clear();
  in.seekg(0);
  std::unique_ptr<PyTorchStreamReader> reader;
  try {
    reader = std::make_unique<PyTorchStreamReader>(&in);
  } catch (const c10::Error& e) {
    throw CorruptData(
        str_cat(source, ": damaged ", kArchive, ": ", one_line(e.what_without_backtrace())));
  }
  // Every source record, wherever it lies (torch.jit.load reads code/; torch.package's copies
  // live under .data/ts_code/), and every pickle (data.pkl, constants.pkl, the debug pickles).
  // LibTorch finds a record by a case-blind name (miniz's default), so the kinds are too.
  for (const auto& [name, bytes] : records) {
    const std::string lower = lowercase(name);
    const bool code = ends_with(lower, ".py");
    const bool pickle = ends_with(lower, ".pkl") || ends_with(lower, ".debug_pkl");
    if (!code && !pickle) continue;
    const std::string text = record_bytes(*reader, name, source);
    const std::string shown = core::printable(name, 120);
    if (pickle) {
      check_globals(text, shown, r);
      continue;
    }
    if (const auto f = scan_script_source(text))
      r.refuse(str_cat(shown, " line ", f->line, ": ", f->what, ": ", f->why));
  }
}

// --- The graph walk -------------------------------------------------------------------------

bool is_custom_class(const c10::TypePtr& type) {
  const auto cls = type->cast<c10::ClassType>();
  if (!cls || !cls->name()) return false;
  return cls->name()->qualifiedName().rfind("__torch__.torch.classes.", 0) == 0;
}

// Walks graphs from the functions it is given and from every function or method they call, so
// that what a graph can reach is walked even where the compilation unit does not list it. Each
// function once; each node, blocks and subgraphs included, handed to the visitor, the graph's
// prim::Param node (whose outputs are the function's inputs) first.
class GraphWalk {
 public:
  explicit GraphWalk(const ScriptNodeVisitor& visit) : visit_(visit) {}

  void function(torch::jit::Function& fn) {
    if (!seen_.insert(&fn).second || !fn.isGraphFunction()) return;
    const auto graph = torch::jit::toGraphFunction(fn).graph();
    visit_(fn, *graph->param_node());
    block(fn, graph->block());
  }

 private:
  void block(const torch::jit::Function& fn, const torch::jit::Block* b) {
    for (const torch::jit::Node* node : b->nodes()) {
      visit_(fn, *node);
      callee(node);
      for (const torch::jit::Block* sub : node->blocks()) block(fn, sub);
      if (node->hasAttribute(c10::attr::Subgraph)) block(fn, node->g(c10::attr::Subgraph)->block());
    }
  }
  // The function a CallFunction node calls, or the method a CallMethod node calls on a class.
  void callee(const torch::jit::Node* node) {
    if (node->kind() == c10::prim::CallFunction && node->inputs().size() > 0)
      if (const auto f = node->input(0)->type()->cast<c10::FunctionType>())
        function(*f->function());
    if (node->kind() == c10::prim::CallMethod && node->inputs().size() > 0)
      if (const auto cls = node->input(0)->type()->cast<c10::ClassType>())
        if (torch::jit::Function* m = cls->findMethod(node->s(c10::attr::name))) function(*m);
  }

  const ScriptNodeVisitor& visit_;
  std::set<const torch::jit::Function*> seen_;
};

// The security check of one node: a refused operator, or a value of a custom class made (or,
// for the prim::Param node, taken).
void check_node(const torch::jit::Function& fn, const torch::jit::Node& node, const Reader& r) {
  const std::string name = core::printable(fn.qualname().qualifiedName(), 120);
  const bool param = node.kind() == c10::prim::Param;
  if (!param) {
    const std::string qual = node.kind().toQualString();
    const size_t sep = qual.find("::");
    const std::string why =
        refused_operator(qual.substr(0, sep), sep == std::string::npos ? "" : qual.substr(sep + 2));
    if (!why.empty()) r.refuse(str_cat(name, " runs ", qual, ", which ", why));
  }
  for (const torch::jit::Value* v : node.outputs())
    if (is_custom_class(v->type()))
      r.refuse(str_cat(name, param ? " takes" : " makes", " a value of the custom class ",
                       v->type()->repr_str(), ", which runs C++ code of its own"));
}

}  // namespace

void inspect_torchscript_file(const std::string& path, const std::string& source,
                              const std::string& advice) {
  std::error_code ec;
  const uint64_t size = std::filesystem::file_size(path, ec);
  std::ifstream in(path, std::ios::binary);
  KRAB_CHECK_ARG(!ec && in, source, ": cannot read the file");
  inspect_archive(in, size, Reader{source, advice});
}

void inspect_torchscript_bytes(const std::string& bytes, const std::string& source,
                               const std::string& advice) {
  std::istringstream in(bytes);
  inspect_archive(in, bytes.size(), Reader{source, advice});
}

void walk_script_graphs(const torch::jit::Module& module, const ScriptNodeVisitor& visit) {
  GraphWalk walk(visit);
  for (torch::jit::Function* fn : module.type()->compilation_unit()->get_functions())
    walk.function(*fn);
  for (const torch::jit::Module& m : module.modules()) {
    for (torch::jit::Function* fn : m.type()->methods()) walk.function(*fn);
    for (torch::jit::Function* fn : m.type()->getForwardPreHooks()) walk.function(*fn);
    for (torch::jit::Function* fn : m.type()->getForwardHooks()) walk.function(*fn);
  }
}

void check_script_graphs(const torch::jit::Module& module, const std::string& source,
                         const std::string& advice) {
  const Reader r{source, advice};
  walk_script_graphs(module, [&](const torch::jit::Function& fn, const torch::jit::Node& node) {
    check_node(fn, node, r);
  });
}

torch::jit::Module load_torchscript_unchecked(std::istream& in, const std::string& source) {
  try {
    return torch::jit::load(in, at::Device(at::kCPU));
  } catch (const c10::Error& e) {
    throw InvalidArgument(str_cat(source, " is not a TorchScript module (", kSaveOne,
                                  "): ", first_line(e.what_without_backtrace())));
  }
}

torch::jit::Module load_torchscript_unchecked(
    std::shared_ptr<caffe2::serialize::ReadAdapterInterface> in, const std::string& source) {
  try {
    return torch::jit::load(std::move(in), at::Device(at::kCPU));
  } catch (const c10::Error& e) {
    throw InvalidArgument(str_cat(source, " is not a TorchScript module (", kSaveOne,
                                  "): ", first_line(e.what_without_backtrace())));
  }
}

torch::jit::Module load_inspected_torchscript_file(
    const std::string& path, const std::string& source, const std::string& advice,
    std::shared_ptr<caffe2::serialize::ReadAdapterInterface> reader) {
  inspect_torchscript_file(path, source, advice);
  std::ifstream in(path, std::ios::binary);
  torch::jit::Module module = reader ? load_torchscript_unchecked(std::move(reader), source)
                                     : load_torchscript_unchecked(in, source);
  check_script_graphs(module, source, advice);
  return module;
}

torch::jit::Module load_inspected_torchscript_bytes(const std::string& bytes,
                                                    const std::string& source,
                                                    const std::string& advice) {
  inspect_torchscript_bytes(bytes, source, advice);
  std::istringstream in(bytes);
  torch::jit::Module module = load_torchscript_unchecked(in, source);
  check_script_graphs(module, source, advice);
  return module;
}

}  // namespace krab::models
