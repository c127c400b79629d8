// What TorchScript krab runs: the operator policy, and the scan of a saved module's source.
//
// A TorchScript file is a program. torch.jit.save writes each class and function of a module as
// Python-like source (the archive's code/ records); torch::jit::load compiles that source and
// runs the module's __setstate__ methods while it unpickles the weights, and every method runs
// whatever operators it calls. Most operators compute on tensors, but a few reach outside the
// process's memory: aten::from_file maps a file (creating or overwriting it with shared=True),
// aten::save writes one, the RPC special forms (rpc_async, rpc_sync, rpc_remote) and RRef
// methods (to_here, ...) call other processes, the c10d:: and other non-aten namespaces reach the
// network or libraries, and custom classes (torch.classes.*) run C++ of their own.
//
// The policy (refused_operator) allows the operators of the aten:: and prim:: namespaces except
// those named above; everything else is refused. It is applied twice:
//   - scan_script_source, to the source text before LibTorch compiles or runs anything: a
//     tokenizer that reads the text as TorchScript's lexer does (strings, comments, line
//     continuations) and refuses every reference that could name a refused operator;
//   - models/script_inspection.h's graph walk, to the compiled graphs after loading and before
//     any method runs (defence in depth: what a text scan could miss, the graph shows).
//
// The source scan is deliberately stricter than TorchScript: it refuses what it cannot rule out.
// How TorchScript's front end resolves names, and what the scan refuses for each:
//   torch.NAME, torch.autograd.NAME   aten::NAME: refused when NAME is refused; `torch` not
//                                     followed by .NAME (an alias, getattr(torch, ...)) refused;
//   ops.NS.NAME                       NS::NAME: NS outside aten and prim refused; `ops` not
//                                     followed by .NS refused;
//   __torch__.torch.classes.*         a custom class: refused (also `__torch__` or
//                                     `__torch__.torch` used as a value, an alias's start);
//   rpc_async, rpc_sync, rpc_remote   special forms: refused wherever the name appears;
//   VALUE.NAME                        a method of a tensor, string or list resolves to
//                                     aten::NAME: refused when NAME is refused, whatever VALUE is
//                                     (so an alias of torch or ops cannot reach one either);
//   getattr(VALUE, "NAME")            the same lookup by a string: a string literal whose text is
//                                     a refused name, or "classes", is refused.
// A user attribute or method that happens to carry a refused name (self.save) is refused too;
// model.trust_code: true is the way to load such a file.
//
// Pure functions; thread-safe.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace krab::models {

// Why krab does not run operator NS::NAME (a sentence such as "writes a file"), or empty when it
// does: aten:: and prim:: operators other than the ones named in this header's introduction.
std::string refused_operator(std::string_view ns, std::string_view name);

// The first reference in a source record that the scan refuses (see above).
struct ScriptFinding {
  int line = 0;      // 1-based line of the source record
  std::string what;  // the reference as written, printable: "torch.from_file", "ops.c10d.send"
  std::string why;   // a sentence: "aten::from_file maps a file into memory (...)"
};

// Scans one source record of a TorchScript archive (a code/**.py record). Returns the first
// refused reference, or nullopt when there is none. Text the tokenizer cannot read as
// TorchScript's lexer would (an unterminated string) is a finding too: what cannot be read
// cannot be cleared. Linear in the size of `source`; any bytes are accepted.
std::optional<ScriptFinding> scan_script_source(std::string_view source);

}  // namespace krab::models
