// Model names resolve only inside the model store: no separators, no "..",
// no absolute paths, no symlinks out of it, and every refused name gets the
// same error; paths given by the operator (resolve_model) stay allowed.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "engine/model_pool.h"
#include "engine/model_store.h"
#include "io/error.h"

namespace wick {
namespace {

namespace fs = std::filesystem;

class ModelStore : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() / ("wick-store-test-" + std::to_string(::getpid()));
    fs::remove_all(root_);
    fs::create_directories(root_ / "store" / "folder-model");
    fs::create_directories(root_ / "outside");
    touch(root_ / "store" / "inside.gguf");
    touch(root_ / "outside" / "secret.gguf");
    fs::create_symlink(root_ / "outside" / "secret.gguf", root_ / "store" / "escape.gguf");
    fs::create_symlink(root_ / "outside", root_ / "store" / "escape-dir");
    fs::create_symlink(root_ / "store" / "inside.gguf", root_ / "store" / "alias.gguf");
    const char* old = std::getenv("WICK_MODELS");
    if (old) saved_ = old;
    setenv("WICK_MODELS", (root_ / "store").c_str(), 1);
  }
  void TearDown() override {
    if (saved_.empty())
      unsetenv("WICK_MODELS");
    else
      setenv("WICK_MODELS", saved_.c_str(), 1);
    fs::remove_all(root_);
  }
  static void touch(const fs::path& p) { std::ofstream(p) << "not a model"; }
  // The message of the ModelError resolve_model_name throws for `name`.
  static std::string refusal(const std::string& name) {
    try {
      resolve_model_name(name);
    } catch (const ModelError& e) {
      return e.what();
    }
    ADD_FAILURE() << "'" << name << "' resolved";
    return "";
  }

  fs::path root_;
  std::string saved_;
};

TEST_F(ModelStore, NamesResolveInsideTheStore) {
  const fs::path store = fs::canonical(root_ / "store");
  EXPECT_EQ(resolve_model_name("inside"), (store / "inside.gguf").string());
  EXPECT_EQ(resolve_model_name("folder-model"), (store / "folder-model").string());
  // a symlink that stays inside is followed
  EXPECT_EQ(resolve_model_name("alias"), (store / "inside.gguf").string());
  EXPECT_EQ(stored_model_names(), (std::vector<std::string>{"alias", "folder-model", "inside"}));
}

TEST_F(ModelStore, RefusedNamesGetTheUnknownModelErrorAlike) {
  const std::string secret = (root_ / "outside" / "secret.gguf").string();
  ASSERT_TRUE(fs::exists(secret));
  const std::string unknown = refusal("no-such-model");
  EXPECT_NE(unknown.find("unknown model 'no-such-model'"), std::string::npos) << unknown;
  for (const std::string& name :
       {std::string("../outside/secret"), std::string("../outside/secret.gguf"), secret,
        std::string("escape"), std::string("escape-dir"), std::string(".."), std::string("."),
        std::string("/etc/passwd"), std::string("../../../etc/passwd"), std::string(""),
        std::string("folder-model/../inside"), std::string("..\\outside\\secret")}) {
    std::string msg = refusal(name);
    // the same text as for a name that exists nowhere, but for the name itself
    const std::string quoted = "'" + name + "'";
    ASSERT_NE(msg.find(quoted), std::string::npos) << msg;
    msg.replace(msg.find(quoted), quoted.size(), "'no-such-model'");
    EXPECT_EQ(msg, unknown) << name;
  }
}

TEST_F(ModelStore, TheOperatorsPathsStayAllowed) {
  const std::string secret = (root_ / "outside" / "secret.gguf").string();
  EXPECT_EQ(resolve_model(secret), secret);  // a path typed on the command line
  EXPECT_EQ(resolve_model("inside"), fs::canonical(root_ / "store" / "inside.gguf").string());
  EXPECT_THROW(resolve_model("escape"), ModelError);  // a name is still a name
}

TEST_F(ModelStore, PoolGetStoredTakesNamesOnly) {
  ModelPool pool(2, 0);
  // not a model, but inside the store: it is opened (and fails to load)
  try {
    pool.get_stored("inside");
    ADD_FAILURE() << "a text file loaded as a model";
  } catch (const std::exception& e) {
    EXPECT_EQ(std::string(e.what()).find("unknown model"), std::string::npos) << e.what();
  }
  // outside: refused before anything is opened
  EXPECT_THROW(pool.get_stored((root_ / "outside" / "secret.gguf").string()), ModelError);
  EXPECT_THROW(pool.get_stored("escape"), ModelError);
  EXPECT_EQ(pool.n_loads(), 1u);
}

}  // namespace
}  // namespace wick
