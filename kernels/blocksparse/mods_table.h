// attnlab: every mask_mod and score_mod of the block-sparse family, one row
// each. From these rows come the kinds (mods.h), the spec parser, the names
// and the lists that messages and the harness's --help give (block_mask.cpp),
// and the kernels' dispatch on a kind (apply_mods.cuh's with_static_kind: a
// case per row, so none can be missing); python/attnlab/mods.py's grammar is
// held to them by a CPU test (tests/python_cpu/test_blocksparse_specs.py).
// A row is a mod's data; its math is its case in mods.h (MaskMod::operator(),
// ScoreMod::operator()), a switch that does not compile without it.
// FlashInfer makes a new logits transform one struct
// (include/flashinfer/attention/variant_helper.cuh); FlashAttention-4's
// CuTe DSL takes a mask_mod and a score_mod as one Python function each
// (flash_attn/cute, tests/cute/mask_mod_definitions.py). Adding a mod:
// docs/blocksparse.md.
//
// X(kind, name, args, form, least_a, least_b, need, tensor), the mask_mods:
//   kind     its MaskModKind
//   name     the spec's NAME
//   args     its arguments as the lists name them ("L,R": two), "" for none;
//            the parser takes each as digits (at most 2^30) into MaskMod::a, b
//   form     the arguments as the parser's "takes ..." message gives them
//   least_a, least_b   the least a and b; 1 marks a divisor, whose division
//            (MaskMod::by_a, by_b: FastDivmod) the parser sets up
//   need     what the "needs ..." message says of one below its least
//   tensor   1: reads a tensor per pair that the caller attaches (the
//            kTensorMods kernels, apply_mods.cuh); not in the harness's lists
#pragma once

#define ATTNLAB_MASK_MODS(X)                                                                                  \
  X(kNone, "none", "", "", 0, 0, "", 0)                                                                       \
  X(kCausal, "causal", "", "", 0, 0, "", 0)                                                                   \
  X(kSlidingWindow, "sliding_window", "L,R", "LEFT,RIGHT", 0, 0, "", 0)                                       \
  X(kBlockDiagonal, "block_diagonal", "B", "B (the block, >= 1)", 1, 0, "a block >= 1", 0)                    \
  X(kMiniCausal, "mini_causal", "B", "B (the block, >= 1)", 1, 0, "a block >= 1", 0)                          \
  X(kPrefixLm, "prefix_lm", "P", "P (the prefix length)", 0, 0, "", 0)                                        \
  X(kDilatedWindow, "dilated_sliding_window", "W,S", "W,S (window, stride >= 1)", 0, 1, "a stride >= 1", 0)   \
  X(kDocument, "document", "", "", 0, 0, "", 0)                                                               \
  X(kTensor, "tensor", "", "", 0, 0, "", 1)

// X(kind, name, args, form, chain_rule, tensor), the score_mods:
//   kind, name, args, form, tensor   as above; an argument is a finite number
//            > 0 (strtof's), into ScoreMod::cap
//   chain_rule   1: ds'/ds is not 1, and the backward multiplies dS by it
//            (ScoreMod::grad, grad_from_output; bwd_mods.cuh's chain_rule)
#define ATTNLAB_SCORE_MODS(X)                          \
  X(kNone, "none", "", "", 0, 0)                       \
  X(kRelBias, "rel_bias", "", "", 0, 0)                \
  X(kAlibi, "alibi", "", "", 0, 0)                     \
  X(kSoftcap, "softcap", "C", "C > 0", 1, 0)           \
  X(kBias, "bias", "", "", 0, 1)
