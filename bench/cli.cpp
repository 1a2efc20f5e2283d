// flash_attn_mma's command line: the flags read against their table
// (cli_flags.h), the program they select, then the rules between options,
// program by program; and --help, written from the same table.
#include "cli.h"

#include <algorithm>
#include <set>

#include "blocksparse/mods.h"
#include "cli_flags.h"
#include "cli_values.h"

namespace attnlab {
namespace {

// A flag of the command line and its value ("" for a switch).
struct GivenFlag {
  const Flag* flag;
  std::string value;
};

// The flags given, by name, for the rules between them.
struct Given {
  std::set<std::string> names;
  bool has(const char* name) const { return names.count(name) > 0; }
};

const Flag* find_flag(const std::string& name) {
  for (const Flag& f : flag_table())
    if (f.name == name || (!f.alias.empty() && f.alias == name)) return &f;
  return nullptr;
}

// "--flag value" or "--flag=value", each flag once; "" or the error line.
std::string read_flags(const std::vector<std::string>& args, std::vector<GivenFlag>* given) {
  std::set<const Flag*> seen;
  for (size_t i = 0; i < args.size(); ++i) {
    std::string name = args[i], value;
    const size_t eq = name.rfind("--", 0) == 0 ? name.find('=') : std::string::npos;
    if (eq != std::string::npos) value = name.substr(eq + 1), name = name.substr(0, eq);
    const Flag* f = find_flag(name);
    if (!f) return "unknown option '" + args[i] + "' (see --help)";
    if (!seen.insert(f).second) return f->name + " given twice";
    if (f->value.empty() && eq != std::string::npos) return f->name + " takes no value";
    if (!f->value.empty() && eq == std::string::npos) {
      if (i + 1 >= args.size()) return f->name + " needs a value";
      value = args[++i];
    }
    given->push_back({f, value});
  }
  return "";
}

// "the dense forward", "block-sparse attention (--mask-mod M)".
std::string program_words(Program p) {
  const ProgramInfo& info = program_info(p);
  return info.name + (info.selector.empty() ? "" : " (" + info.selector + ")");
}

// The names of `programs` joined: "a", "a and b", "a, b and c".
std::string names_words(const std::vector<Program>& programs) {
  std::string words;
  for (size_t i = 0; i < programs.size(); ++i)
    words += (i == 0 ? "" : i + 1 == programs.size() ? " and " : ", ") + program_info(programs[i]).name;
  return words;
}

// "every program", "dynamic-mask attention (--mask M)", "the dense forward and the dense backward",
// "every program but block-sparse attention", "every program but variable-length attention and paged
// decoding": a flag of most programs is named by the one or two it is not an option of.
std::string programs_words(Programs programs) {
  if (programs == kEveryProgram) return "every program";
  std::vector<Program> in, out;
  for (const ProgramInfo& info : program_table())
    (programs & program_bit(info.program) ? in : out).push_back(info.program);
  if (in.size() == 1) return program_words(in[0]);
  if (out.size() <= 2 && in.size() > out.size() && in.size() > 2) return "every program but " + names_words(out);
  return names_words(in);
}

// --mask-mod selects block-sparse attention, --mask dynamic-mask attention,
// --varlen variable-length attention, --decode paged decoding, none of them
// the dense forward; --bwd, or a flag that implies it, the selected program's
// backward (the dense forward's is the dense backward; variable-length
// attention and paged decoding refuse it). Then the program's own defaults,
// which its flags may override: paged decoding's one new token, causal.
std::string select_program(const std::vector<GivenFlag>& given, Options* o) {
  struct Selector {
    const char* flag;
    Program program;
  };
  static const Selector selectors[] = {{"--mask", Program::kDynamicMask},
                                       {"--mask-mod", Program::kBlocksparse},
                                       {"--varlen", Program::kVarlen},
                                       {"--decode", Program::kDecode}};
  std::vector<const Selector*> chosen;
  bool bwd = false;
  for (const GivenFlag& g : given) {
    for (const Selector& s : selectors)
      if (g.flag->name == s.flag) chosen.push_back(&s);
    bwd = bwd || g.flag->name == "--bwd" || g.flag->backward;
  }
  if (chosen.size() > 1)
    return std::string(chosen[0]->flag) + " and " + chosen[1]->flag + " select two programs (" +
           program_info(chosen[0]->program).name + " and " + program_info(chosen[1]->program).name + "): give one";
  o->program = !chosen.empty() ? chosen[0]->program : bwd ? Program::kDenseBackward : Program::kDenseForward;
  o->common.bwd = bwd;
  if (o->program == Program::kDecode) {
    o->common.Nq = 1;
    o->common.causal = true;
  }
  return "";
}

// A flag of another program: one line that says whose it is, and what this
// program has instead where the table says.
std::string wrong_program(const Flag& f, Program p) {
  std::string line = f.name + " is an option of " + programs_words(f.programs) + "; this run is " + program_words(p);
  for (const Elsewhere& e : f.elsewhere)
    if (e.program == p) line += "; " + e.text;
  return line;
}

// ---- the rules between options ------------------------------------------------------

std::string check_common(const Given& g, const CommonOptions& c) {
  if (g.has("--N") && g.has("--Nq") && g.has("--Nk")) return "--N has no effect with both --Nq and --Nk";
  if (g.has("--check") && g.has("--no-check")) return "--check and --no-check contradict each other";
  for (const char* f : {"--torch", "--sdpa"})
    if (g.has(f) && g.has("--no-peers")) return std::string(f) + " and --no-peers contradict each other";
  if (c.Hkv > 0 && c.H % c.Hkv != 0)
    return "--H must be a multiple of --Hkv, got --H " + std::to_string(c.H) + " and --Hkv " + std::to_string(c.Hkv);
  return "";
}

// The dense forward's and backward's: the sweep's grid, the reference.
std::string check_dense(const Given& g, const CommonOptions& c, const DenseOptions& d) {
  for (const char* f : {"--sweep-N", "--sweep-D", "--sweep-causal"})
    if (g.has(f) && !d.sweep) return std::string(f) + " needs --sweep";
  if (d.sweep)
    for (const char* f : {"--N", "--Nq", "--Nk", "--D", "--Dv", "--causal"})
      if (g.has(f))
        return std::string(f) + " does not apply to --sweep: the grid sets it (--sweep-N, --sweep-D, --sweep-causal)";
  if (d.sweep && d.show_all) return "--show-all does not apply to --sweep: it prints one line per shape";
  if (g.has("--reference") && !c.check)
    return "--reference does not apply with --no-check (it is what the check compares against)";
  return "";
}

// dmattn's: the options that read the mask, or that one mask needs.
std::string check_dynamic_mask(const Given& g, const CommonOptions& c, const DynamicMaskOptions& m) {
  for (const char* f : {"--window", "--block"})
    if (g.has(f) && m.mask != "topk") return std::string(f) + " needs --mask topk";
  const bool mask_tensor = m.mask == "topk" || m.mask == "ones";
  if (m.mask_bits && !mask_tensor) return "--mask-bits packs the mask: add --mask ones or --mask topk";
  for (const char* f : {"--dma-mask-scan", "--dma-prepass-chunks", "--bwd-own-prepass"})
    if (g.has(f) && !mask_tensor) return std::string(f) + " reads the mask: add --mask ones or --mask topk";
  if (g.has("--dma-prepass-chunks") && m.dma_mask_scan != "auto" && m.dma_mask_scan != "pipelined")
    return "--dma-prepass-chunks needs --dma-mask-scan pipelined or auto, not " + m.dma_mask_scan;
  if (m.dma_core == "gather" && (c.Nq != 1 || !mask_tensor))
    return "--dma-core gather needs one query row (--Nq 1) and a mask (--mask ones or --mask topk)";
  if (g.has("--bwd-chunks") && c.deterministic)
    return "--bwd-chunks does not apply to --deterministic, which always runs one chunk";
  if (m.mask == "topk" && !m.bias) return "--mask topk selects keys by the bias: add --bias";
  if (c.Dv != c.D) return "dynamic-mask attention needs Dv == D";
  return "";
}

// "document:K" -> "document" and K in *count (when given); any other spec as it is.
std::string split_document_count(const std::string& spec, int L, int* count, std::string* error) {
  if (spec.rfind("document:", 0) != 0) return spec;
  const std::string k = spec.substr(9);
  if (!parse_int("--mask-mod document:K", k, 1, L, count).empty())
    *error = "--mask-mod document:K takes K documents, 1 to the sequence length " + std::to_string(L) + ", got '" +
             k + "'";
  return "document";
}

// block-sparse attention's: its specs, by mods.h's parser. The mods that read
// a tensor, which only a caller can supply (attnlab.flex_attention), are not
// the harness's: its lists leave them out.
std::string check_blocksparse(const CommonOptions& c, BlocksparseOptions& s) {
  std::string why;
  const int L = std::max(c.Nq, c.Nk);
  s.document_count = std::min(s.document_count, L);
  const std::string mask_spec = split_document_count(s.mask_mod, L, &s.document_count, &why);
  if (mask_spec == "tensor")
    return "--mask-mod tensor reads a keep tensor, which the harness does not make (attnlab.flex_attention takes "
           "one); the harness's mask_mods: " + mask_mod_names(false);
  if (s.score_mod == "bias")
    return "--score-mod bias reads a bias tensor, which the harness does not make (attnlab.flex_attention takes "
           "one; --bias is the dynamic-mask mode's); the harness's score_mods: " + score_mod_names(false);
  if (why.empty()) parse_mask_mod(mask_spec, c.Nq, c.Nk, why);
  if (why.rfind("unknown mask_mod", 0) == 0)
    return "--mask-mod: unknown mask_mod '" + s.mask_mod + "' (" + mask_mod_names(false) + ")";
  if (!why.empty()) return why.rfind("--mask-mod", 0) == 0 ? why : "--mask-mod: " + why;
  if (!s.score_mod.empty()) parse_score_mod(s.score_mod, c.H, why);
  if (why.rfind("unknown score_mod", 0) == 0)
    return "--score-mod: unknown score_mod '" + s.score_mod + "' (" + score_mod_names(false) + ")";
  if (!why.empty()) return "--score-mod: " + why;
  return "";
}

// Variable-length attention's: the key lengths, one per sequence.
std::string check_varlen(const VarlenOptions& v) {
  if (v.k.given() && v.k.count() != v.q.count())
    return "--varlen-k gives " + std::to_string(v.k.count()) + " key length" + (v.k.count() == 1 ? "" : "s") +
           " for " + std::to_string(v.q.count()) + " sequence" + (v.q.count() == 1 ? "" : "s") +
           " (--varlen): one per sequence";
  return "";
}

// Paged decoding's: the mask said once, V's head dim that of K.
std::string check_decode(const Given& g, const CommonOptions& c) {
  if (g.has("--causal") && g.has("--no-causal")) return "--causal and --no-causal contradict each other";
  if (c.Dv != c.D)
    return "paged decoding needs Dv == D, got --D " + std::to_string(c.D) + " and --Dv " + std::to_string(c.Dv);
  return "";
}

// ---- --help ---------------------------------------------------------------------------

// `text` wrapped at 80 columns, every line `indent` deep; the first line
// starts after `head` (padded to the indent, or on a line of its own when
// it reaches the indent).
std::string wrap(const std::string& head, const std::string& text, size_t indent) {
  const size_t width = 80;
  std::string out = head, word;
  size_t column = out.size();
  bool first = true;
  for (size_t i = 0; i <= text.size(); ++i) {
    if (i < text.size() && text[i] != ' ') {
      word += text[i];
      continue;
    }
    if (word.empty()) continue;
    if (first && (column < indent || head.empty())) {
      out += std::string(indent - column, ' '), column = indent;
    } else if (first || column + 1 + word.size() > width) {
      out += "\n" + std::string(indent, ' '), column = indent;
    } else {
      out += ' ', ++column;
    }
    out += word, column += word.size(), first = false;
    word.clear();
  }
  return out + "\n";
}

const char* kSynopsis = R"(flash_attn_mma — time and check every attention variant on one shape

usage: flash_attn_mma [options]      (--flag V or --flag=V; each option once)
  --B 1 --H 8 --N 8192 --D 128     every rung and peer of this build, each row checked
    --causal --dtype bf16 --Hkv 2  a causal mask, bf16, 8 query heads over 2 KV heads
    --variant 'ws*' --no-peers --no-check   the rungs that match, alone, timed only
  --bwd [--deterministic]          the backward rungs (the deterministic ones) instead
  --mask topk --window 1024 --bias dynamic-mask attention (flash-dmattn's), below
  --mask-mod sliding_window:512,0  block-sparse attention (FlexAttention's mods), below
  --varlen 8192,1,517,3000 --unverified  variable-length attention, below
  --decode 4096,517 --Nq 1 --unverified  paged decoding (a KV cache in pages), below
  --list                           every variant and its tiles (no GPU needed)
exit status: 0 ok, 1 a check or the run failed, 2 bad options, 3 no usable GPU

)";

const char* kExitStatus = R"(
exit status: 0 every row ran (and, unless --no-check, passed);
1 a check failed, or the run failed (a GPU error, a row that could not be
written to --csv); 2 bad options (nothing ran); 3 no usable CUDA GPU (nothing
ran; the message says what is missing, the NVIDIA driver or a GPU, then CUDA's
own words)
)";

}  // namespace

std::string usage() {
  std::string out = kSynopsis;
  out += wrap("", "Six programs, each with its rows and its options: --mask-mod selects block-sparse attention, "
                  "--mask dynamic-mask attention, --varlen variable-length attention, --decode paged decoding, none "
                  "of them the dense forward; --bwd (or --deterministic) runs the backward of the one selected. An "
                  "option of another program is an error.", 0);
  for (const ProgramInfo& info : program_table())
    out += "\n" + program_words(info.program) + ":\n" + wrap("", info.about, 2);
  // The flags, grouped by the programs they belong to, in the table's order.
  std::vector<Programs> groups;
  for (const Flag& f : flag_table())
    if (std::find(groups.begin(), groups.end(), f.programs) == groups.end()) groups.push_back(f.programs);
  for (Programs group : groups) {
    out += "\noptions of " + programs_words(group) + ":\n";
    for (const Flag& f : flag_table())
      if (f.programs == group) out += wrap("  " + f.name + (f.value.empty() ? "" : " " + f.value), f.help, 20);
  }
  return out + kExitStatus;
}

ParseResult parse_args(const std::vector<std::string>& args) {
  ParseResult r;
  Options& o = r.options;
  // --help (or -h) anywhere: the help, whatever else is given.
  for (const std::string& a : args)
    if (a == "--help" || a == "-h") {
      o.common.help = true;
      return r;
    }
  std::vector<GivenFlag> flags;
  r.error = read_flags(args, &flags);
  if (r.error.empty()) r.error = select_program(flags, &o);
  for (const GivenFlag& g : flags)
    if (r.error.empty() && !(g.flag->programs & program_bit(o.program))) r.error = wrong_program(*g.flag, o.program);
  if (!r.error.empty()) return r;

  // Each value, in the table's order: --N before --Nq and --Nk, --D before --Dv.
  Given given;
  for (const Flag& f : flag_table())
    for (const GivenFlag& g : flags)
      if (g.flag == &f) {
        given.names.insert(f.name);
        if (std::string e = f.set(f.name, g.value, o); !e.empty()) {
          r.error = e;
          return r;
        }
      }
  r.error = check_common(given, o.common);
  if (!r.error.empty()) return r;
  switch (o.program) {
    case Program::kDenseForward:
    case Program::kDenseBackward: r.error = check_dense(given, o.common, o.dense); break;
    case Program::kDynamicMask: r.error = check_dynamic_mask(given, o.common, o.dynamic_mask); break;
    case Program::kBlocksparse: r.error = check_blocksparse(o.common, o.blocksparse); break;
    case Program::kVarlen: r.error = check_varlen(o.varlen); break;
    case Program::kDecode: r.error = check_decode(given, o.common); break;
  }
  return r;
}

AttnProblem to_problem(const CommonOptions& c) {
  AttnProblem p;
  p.B = c.B;
  p.H = c.H;
  p.Hkv = c.Hkv;
  p.Nq = c.Nq;
  p.Nk = c.Nk;
  p.D = c.D;
  p.Dv = c.Dv;
  p.dtype = c.dtype;
  p.causal = c.causal;
  p.scale = default_scale(c.D);
  return p;
}

}  // namespace attnlab
