// Where a checkpoint's chat template and special tokens come from (transformers' order of precedence).

#include "chat_template/checkpoint_template.h"

#include <filesystem>
#include <fstream>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace strata::chat_template {
namespace {

using ::testing::HasSubstr;

class CheckpointTemplate : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("strata_chat_template_" + std::to_string(::testing::UnitTest::GetInstance()->random_seed()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  void Write(const std::string& name, const std::string& text) {
    std::filesystem::create_directories((dir_ / name).parent_path());
    std::ofstream(dir_ / name) << text;
  }
  std::string Render(const CheckpointChatTemplate& c, std::string_view name, bool tools) {
    auto t = c.Select(name, tools);
    if (!t.ok()) return std::string(t.status().ToString());
    auto out = (*t)->Render(c.special_tokens);
    return out.ok() ? *out : std::string(out.status().ToString());
  }
  std::filesystem::path dir_;
};

TEST_F(CheckpointTemplate, ChatTemplateJinjaWinsOverTokenizerConfig) {
  Write("tokenizer_config.json", R"({"chat_template": "config", "bos_token": "<s>"})");
  Write("chat_template.jinja", "file {{ bos_token }}\n");
  auto c = LoadChatTemplate(dir_);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(Render(*c, "", false), "file <s>");
}

TEST_F(CheckpointTemplate, SpecialTokensAsTransformersReadsThem) {
  Write("tokenizer_config.json", R"({
    "chat_template": "{{ bos_token }}|{{ eos_token }}|{{ pad_token }}|{{ unk_token is defined }}|{{ image_token }}|{{ x_token }}",
    "bos_token": {"__type": "AddedToken", "content": "<|begin|>", "lstrip": false},
    "eos_token": "<|end|>", "pad_token": null, "unk_token": null, "image_token": "<img>",
    "add_bos_token": true, "extra_special_tokens": {"x_token": "<x>"}})");
  auto c = LoadChatTemplate(dir_);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(Render(*c, "", false), "<|begin|>|<|end|>||False|<img>|<x>");
}

TEST_F(CheckpointTemplate, NamedTemplatesDefaultAndToolUse) {
  Write("tokenizer_config.json",
        R"({"chat_template": [{"name": "default", "template": "D"}, {"name": "tool_use", "template": "T"}]})");
  auto c = LoadChatTemplate(dir_);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(Render(*c, "", false), "D");
  EXPECT_EQ(Render(*c, "", true), "T");
  EXPECT_EQ(Render(*c, "tool_use", false), "T");
  EXPECT_THAT(Render(*c, "rag", false),
              HasSubstr("no chat template named \"rag\" (the checkpoint has: default, tool_use)"));
}

TEST_F(CheckpointTemplate, AdditionalChatTemplatesDirectory) {
  Write("chat_template.jinja", "D");
  Write("additional_chat_templates/tool_use.jinja", "T");
  auto c = LoadChatTemplate(dir_);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(Render(*c, "", true), "T");
}

TEST_F(CheckpointTemplate, OverrideFileWins) {
  Write("chat_template.jinja", "D");
  Write("mine.jinja", "M{{ eos_token }}");
  Write("tokenizer_config.json", R"({"eos_token": "</s>"})");
  auto c = LoadChatTemplate(dir_, dir_ / "mine.jinja");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(Render(*c, "", false), "M</s>");
}

TEST_F(CheckpointTemplate, ErrorsNameTheFile) {
  auto none = LoadChatTemplate(dir_);
  EXPECT_TRUE(absl::IsNotFound(none.status())) << none.status();
  EXPECT_THAT(none.status().ToString(), HasSubstr("no chat template"));
  Write("tokenizer_config.json", R"({"chat_template": "ok\n{% if %}"})");
  auto bad = LoadChatTemplate(dir_);
  EXPECT_THAT(bad.status().ToString(), HasSubstr("tokenizer_config.json[chat_template]:2:"));
  Write("chat_template.jinja", "{{ x");
  bad = LoadChatTemplate(dir_);
  EXPECT_THAT(bad.status().ToString(), HasSubstr("chat_template.jinja:1:"));
  Write("tokenizer_config.json", "[1, 2");
  std::filesystem::remove(dir_ / "chat_template.jinja");
  EXPECT_THAT(LoadChatTemplate(dir_).status().ToString(), HasSubstr("tokenizer_config.json: not valid JSON"));
  Write("tokenizer_config.json", "[1, 2]");
  EXPECT_THAT(LoadChatTemplate(dir_).status().ToString(), HasSubstr("tokenizer_config.json: not a JSON object"));
  Write("tokenizer_config.json", std::string(200, '[') + std::string(200, ']'));
  EXPECT_THAT(LoadChatTemplate(dir_).status().ToString(),
              HasSubstr("tokenizer_config.json: JSON nests deeper than 127 levels"));
  EXPECT_FALSE(LoadChatTemplate(dir_, "/dev/zero").ok());
}

}  // namespace
}  // namespace strata::chat_template
