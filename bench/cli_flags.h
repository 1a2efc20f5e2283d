// attnlab: flash_attn_mma's flags, one row each: its name, its value, the
// programs it belongs to, its help line and what it sets. parse_args and
// usage() (cli.cpp) read this table, so a flag is declared once.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "cli.h"

namespace attnlab {

// A set of programs, one bit each.
using Programs = unsigned;
constexpr Programs program_bit(Program p) { return 1u << unsigned(p); }
constexpr Programs kDenseForward = program_bit(Program::kDenseForward);
constexpr Programs kDenseBackward = program_bit(Program::kDenseBackward);
constexpr Programs kDynamicMask = program_bit(Program::kDynamicMask);
constexpr Programs kBlocksparse = program_bit(Program::kBlocksparse);
constexpr Programs kVarlen = program_bit(Program::kVarlen);
constexpr Programs kDecode = program_bit(Program::kDecode);
constexpr Programs kDense = kDenseForward | kDenseBackward;
constexpr Programs kEveryProgram = kDense | kDynamicMask | kBlocksparse | kVarlen | kDecode;

// Parses `value` (empty for a switch) into the options; "" or the error line.
using SetOption = std::function<std::string(const std::string& flag, const std::string& value, Options& o)>;

// What program `program` has instead of a flag it refuses, said in its error
// ("block-sparse attention's causal mask is --mask-mod causal").
struct Elsewhere {
  Program program;
  std::string text;
};

struct Flag {
  std::string name;    // "--window"
  std::string value;   // its value as the help names it ("W"); "" for a switch
  Programs programs;   // the programs it belongs to: given to another, it is an error
  std::string help;    // one line, wrapped by usage()
  SetOption set;       // the rows are applied in table order: a later row may override an earlier one's default
  bool backward = false;   // implies --bwd
  std::string alias = "";      // another spelling ("--show")
  std::vector<Elsewhere> elsewhere = {};  // what the programs that refuse it have instead
};

// Every flag, grouped by the programs they belong to; --help lists them in
// this order.
const std::vector<Flag>& flag_table();

// A program as --help and the errors name it.
struct ProgramInfo {
  Program program;
  std::string name;      // "dynamic-mask attention"
  std::string selector;  // what selects it: "--mask M"; "" for the default
  std::string about;     // its paragraph in --help: the rows, the check, the FLOP count
};
const std::vector<ProgramInfo>& program_table();
const ProgramInfo& program_info(Program p);

}  // namespace attnlab
