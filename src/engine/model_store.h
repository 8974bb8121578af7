// Where models live: MODEL arguments are a .gguf path, a HF folder, or a name
// in the model store ($WICK_MODELS, default ~/.cache/wick/models).
//
// A path is what an operator types on the command line; a NAME is all that
// a server's clients may give. A name resolves only inside the store: no
// path separators, no "..", and no entry that leads (through a symlink)
// out of it. Every refused name gets the same "unknown model" error, so the
// error does not tell which files exist elsewhere.
#pragma once

#include <string>
#include <vector>

namespace wick {

std::string model_store_dir();
// The path MODEL refers to: MODEL itself when it exists (or is shaped:...),
// else resolve_model_name(MODEL).
std::string resolve_model(const std::string& model);
// The canonical path of the stored model NAME (store/NAME.gguf or the folder
// store/NAME); throws ModelError "unknown model ..." naming the store.
std::string resolve_model_name(const std::string& name);
// The names in the store that resolve (a .gguf file's stem, a folder's name), sorted.
std::vector<std::string> stored_model_names();

// The store's entry for NAME as it sits in the store (store/NAME.gguf or the
// folder store/NAME, a symlink not followed), when NAME resolves inside the
// store; else empty. What deleting NAME removes.
std::string stored_model_entry(const std::string& name);
// Whether NAME may name a new model: 1-128 of [A-Za-z0-9._:-], not starting with '.'.
bool is_valid_new_model_name(const std::string& name);
// Copies stored model FROM to the new name TO inside the store (a hard link
// where the file system allows, else a copy; a folder's files likewise).
// Throws ModelError: FROM unknown ("unknown model ..."), TO invalid or taken.
void copy_stored_model(const std::string& from, const std::string& to);
// Removes stored model NAME's entry (a symlink, not what it points to);
// throws ModelError "unknown model ..." when NAME does not resolve.
void delete_stored_model(const std::string& name);

}  // namespace wick
