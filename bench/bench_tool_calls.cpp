// The streaming tool-call parser's cost per piece of output: 14 KB of text
// (content with '<' and braces, then one long Hermes call) pushed 4 bytes at
// a time, about a token's worth.
#include <benchmark/benchmark.h>

#include <string>

#include "text/tool_calls.h"

namespace {

std::string output() {
  std::string text;
  for (int i = 0; i < 200; ++i) text += "Some plain answer text, with <b>tags</b> and { braces }. ";
  text += "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"code\": \"";
  for (int i = 0; i < 200; ++i) text += "x = [1, 2, 3]; ";
  return text + "\"}}\n</tool_call>";
}

void BM_ToolCallStream(benchmark::State& st) {
  const std::string text = output();
  size_t n_pieces = 0;
  for (auto _ : st) {
    wick::ToolCallParser p(wick::ToolFormat::Hermes, "call_");
    for (size_t i = 0; i < text.size(); i += 4, ++n_pieces)
      benchmark::DoNotOptimize(p.push(std::string_view(text).substr(i, 4)));
    benchmark::DoNotOptimize(p.finish());
    if (p.calls().size() != 1) st.SkipWithError("the call was not found");
  }
  st.SetItemsProcessed(int64_t(n_pieces));  // items/s: pieces (tokens) per second
}
BENCHMARK(BM_ToolCallStream);

}  // namespace
