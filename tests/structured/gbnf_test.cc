// llama.cpp GBNF's empty alternatives, written as the empty string xgrammar's EBNF needs; nothing else changes.
#include "structured/gbnf.h"

#include "gtest/gtest.h"

namespace strata::structured {
namespace {

TEST(FillEmptyAlternatives, LeadingMiddleAndTrailing) {
  EXPECT_EQ(FillEmptyAlternatives(R"(ws ::= | " ")"), R"(ws ::= "" | " ")");
  EXPECT_EQ(FillEmptyAlternatives(R"(ws ::= " " | | "\n")"), R"(ws ::= " " | "" | "\n")");
  EXPECT_EQ(FillEmptyAlternatives(R"(ws ::= " " |)"), R"(ws ::= " " | "")");
  EXPECT_EQ(FillEmptyAlternatives("a ::= \"x\" |\nb ::= \"y\""), "a ::= \"x\" | \"\"\nb ::= \"y\"");
}

TEST(FillEmptyAlternatives, InGroupsAndEmptyBodies) {
  EXPECT_EQ(FillEmptyAlternatives(R"(root ::= ("a" |) "b")"), R"(root ::= ("a" | "") "b")");
  EXPECT_EQ(FillEmptyAlternatives(R"(root ::= ( | "a") "b")"), R"(root ::= ( "" | "a") "b")");
  EXPECT_EQ(FillEmptyAlternatives(R"(root ::= () "b")"), R"(root ::= ( "") "b")");
  EXPECT_EQ(FillEmptyAlternatives("e ::=\nroot ::= e \"b\""), "e ::= \"\"\nroot ::= e \"b\"");
}

TEST(FillEmptyAlternatives, StringsClassesAndCommentsAreText) {
  const std::string grammar =
      "root ::= \"|\" [|(] \"\\\"|\" # a comment with | and ::= |\n"
      "  | \"x\"\n";
  EXPECT_EQ(FillEmptyAlternatives(grammar), grammar);
  EXPECT_EQ(FillEmptyAlternatives(R"(root ::= "a" | "b" (c)*)"), R"(root ::= "a" | "b" (c)*)");
}

}  // namespace
}  // namespace strata::structured
