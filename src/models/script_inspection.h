// Inspecting a TorchScript archive before anything in it runs.
//
// A TorchScript file is a program (models/script_scan.h says what it can reach and what krab
// refuses). Loading one is safe only in two steps, each before the step of LibTorch that would
// run the file's code:
//
//   inspect_torchscript_file(path, source)        before torch::jit::load: the zip directory
//   inspect_torchscript_bytes(bytes, source)      and every pickle walked without being believed
//                                                 (core/archive_walk.h), every pickle's globals
//                                                 checked (no custom class), every source record
//                                                 scanned (scan_script_source);
//   module = torch::jit::load(...)                compiles the source, unpickles the weights and
//                                                 runs __setstate__ methods;
//   check_script_graphs(module, source)           before any method runs: the graph of every
//                                                 function and method compiled from the archive
//                                                 walked, and every operator checked against
//                                                 refused_operator, every value against custom
//                                                 classes.
//
// models::TorchScriptModel does both unless model.trust_code is set. Another reader of
// TorchScript bytes that did not come from the user (a federated client given a model by its
// server) calls load_inspected_torchscript_bytes, which does all three steps on the same bytes.
//
// Failures throw, each message one line that starts with `source` (the caller's name for the
// file, e.g. "model.path: 'net.ts'"):
//   InvalidArgument  not a zip archive; the pre-1.5 format (model.json) or any archive without
//                    data.pkl; a refused reference: "SOURCE: code/__torch__.py line 7:
//                    torch.from_file: aten::from_file maps a file ...", naming the record inside
//                    the archive, the line and the reference; a pickle naming a custom class or
//                    using STACK_GLOBAL; a graph node running a refused operator, naming the
//                    function and the operator.
//   CorruptData      a zip directory or pickle whose sizes are not backed by its bytes, a record
//                    LibTorch's reader cannot read.
// A refusal's message ends with "; ADVICE" when `advice` is not empty: what the caller's user
// can do about it (for model.path: "set model.trust_code: true to load it anyway if you vouch
// for the file"). The other failures do not carry it.
//
// Cost: reads the archive's directory, its source and pickle records (not the tensors' data).
// The scan takes well under a millisecond per hundred kilobytes of source (7 MB in 20 ms of
// CPU); loading a 45 MB ResNet-18 file with and without the inspection takes the same time
// within noise. Thread-safe: no shared state.
#pragma once

#include <torch/script.h>

#include <functional>
#include <memory>
#include <string>

namespace krab::models {

// Inspects the archive at `path`; throws as above, or InvalidArgument when it cannot be read.
void inspect_torchscript_file(const std::string& path, const std::string& source,
                              const std::string& advice = "");

// Inspects an archive held in memory (`bytes`, as torch::jit::load(std::istream&) would read
// them); throws as above.
void inspect_torchscript_bytes(const std::string& bytes, const std::string& source,
                               const std::string& advice = "");

// Called once for every node of every graph walk_script_graphs reaches: `fn` is the function
// (or method) whose graph holds `node`.
using ScriptNodeVisitor =
    std::function<void(const torch::jit::Function& fn, const torch::jit::Node& node)>;

// The walk behind check_script_graphs, for other checks of a loaded module's code (the frozen
// train/eval flags of models/script_modes.h): every function and method of `module`'s
// compilation unit, every method and hook of every submodule's type, and every function or
// method a graph calls, each once; within a graph its prim::Param node (whose outputs are the
// inputs) first, then every node, those of nested blocks and subgraphs included. `visit` may
// throw; the walk stops there.
void walk_script_graphs(const torch::jit::Module& module, const ScriptNodeVisitor& visit);

// Walks the graphs of every function and method of `module`'s compilation unit (every class of
// the archive, submodules' types included) and of every method of every submodule; throws
// InvalidArgument naming the function and the operator for a refused one (see above).
void check_script_graphs(const torch::jit::Module& module, const std::string& source,
                         const std::string& advice = "");

// The three steps at once: inspect, torch::jit::load, check_script_graphs. Returns the module,
// on the CPU, none of whose code has run except its __setstate__ methods (inspected first);
// throws as above, and InvalidArgument "SOURCE is not a TorchScript module (...): LibTorch's
// message" when LibTorch cannot load what passed the inspection.
// With `reader`, torch::jit::load reads the file through it (models/script_deferred.h).
torch::jit::Module load_inspected_torchscript_file(
    const std::string& path, const std::string& source, const std::string& advice = "",
    std::shared_ptr<caffe2::serialize::ReadAdapterInterface> reader = nullptr);
torch::jit::Module load_inspected_torchscript_bytes(const std::string& bytes,
                                                    const std::string& source,
                                                    const std::string& advice = "");

// torch::jit::load(`in`) onto the CPU, without any inspection (for a file the user vouches
// for); LibTorch's failure as InvalidArgument "SOURCE is not a TorchScript module ...".
torch::jit::Module load_torchscript_unchecked(std::istream& in, const std::string& source);
torch::jit::Module load_torchscript_unchecked(
    std::shared_ptr<caffe2::serialize::ReadAdapterInterface> in, const std::string& source);

}  // namespace krab::models
