// Speculative decoding flags, shared by generate, run, serve and bench:
// --spec, --draft, --draft-max, --draft-min, --draft-p-min, --ngram-min,
// --ngram-max.
#pragma once

#include <CLI/CLI.hpp>
#include <string>

#include "engine/speculative.h"

namespace wick::cli {

struct SpecOptions {
  std::string method;  // off, ngram, draft; empty: draft with --draft, else off
  std::string draft;   // MODEL
  SpecConfig cfg;
};

void add_spec_options(CLI::App* cmd, SpecOptions& o);
// The engine's SpecConfig; loads the draft model (on the command's device).
SpecConfig spec_config(const SpecOptions& o);

}  // namespace wick::cli
