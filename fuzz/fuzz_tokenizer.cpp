// tokenizer.json from a stranger, then text through it: the input is the
// JSON, a NUL byte, and the text. Loading fails only with a TextError; encode
// fails only on invalid UTF-8 (a TextError); every id is in the vocabulary and
// decodes without error. Without a NUL the whole input is text for the
// shared Llama 2 and Qwen3 tokenizers (the regexes and normalizers real
// models ship).
#include "fuzz_input.h"

using namespace wick;

namespace {

void run_text(const Tokenizer& tk, std::string_view text) {
  for (bool special : {false, true}) {
    std::vector<int32_t> ids;
    try {
      ids = tk.encode(text, {.add_special = special, .parse_special = special});
    } catch (const TextError&) {
      return;  // invalid UTF-8
    }
    for (int32_t id : ids)
      if (id < 0 || id >= tk.n_vocab()) std::abort();
    (void)tk.decode(ids, !special);
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  (void)fuzz::shared_tokenizer("llama2");
  (void)fuzz::shared_tokenizer("qwen3");
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto [head, text] = fuzz::split_at_nul(data, size);
  if (head.size() == size) {
    static const Tokenizer& llama2 = fuzz::shared_tokenizer("llama2");
    static const Tokenizer& qwen3 = fuzz::shared_tokenizer("qwen3");
    run_text(llama2, head);
    run_text(qwen3, head);
    return 0;
  }
  std::unique_ptr<Tokenizer> tk;
  try {
    tk = Tokenizer::from_json(std::string(head), "fuzz.json");
  } catch (const TextError&) {
    return 0;
  }
  run_text(*tk, text);
  return 0;
}
