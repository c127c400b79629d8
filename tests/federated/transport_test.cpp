// The tokens file: what it accepts and how it names a bad line.
#include "federated/transport.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "core/errors.h"

namespace krab::federated {
namespace {

std::string write_tokens(const std::string& text) {
  const std::string path = (std::filesystem::temp_directory_path() /
                            ("krab-tokens-" + std::to_string(::getpid()) + ".txt"))
                               .string();
  std::ofstream(path) << text;
  return path;
}

std::string error_of(const std::string& text) {
  const std::string path = write_tokens(text);
  try {
    read_tokens(path);
  } catch (const InvalidArgument& e) {
    std::filesystem::remove(path);
    return e.what();
  }
  std::filesystem::remove(path);
  return "(accepted)";
}

TEST(Tokens, ParsesNamesTokensAndExpiry) {
  const std::string path = write_tokens(
      "# clients of the credit-scoring federation\n"
      "north 0123456789abcdef0123\n"
      "\n"
      "south fedcba9876543210fedc 1999999999\n");
  const auto t = read_tokens(path);
  std::filesystem::remove(path);
  ASSERT_EQ(t.size(), 2u);
  EXPECT_EQ(t.at("0123456789abcdef0123").client, "north");
  EXPECT_EQ(t.at("0123456789abcdef0123").expires, 0);
  EXPECT_EQ(t.at("fedcba9876543210fedc").client, "south");
  EXPECT_EQ(t.at("fedcba9876543210fedc").expires, 1999999999);
}

TEST(Tokens, BadLinesAreNamedByFileAndLine) {
  EXPECT_NE(error_of("a 0123456789abcdef0123\nb short\n").find(":2: token of 'b' is shorter"),
            std::string::npos);
  EXPECT_NE(error_of("a 0123456789abcdef0123 soon\n").find(":1: EXPIRES must be unix seconds"),
            std::string::npos);
  EXPECT_NE(error_of("a 0123456789abcdef0123\na 0123456789abcdef0124\n").find("listed twice"),
            std::string::npos);
  EXPECT_NE(error_of("a 0123456789abcdef0123\nb 0123456789abcdef0123\n").find("another client"),
            std::string::npos);
  EXPECT_NE(error_of("lonely\n").find("expected 'NAME TOKEN [EXPIRES]'"), std::string::npos);
  EXPECT_NE(error_of("# nothing\n").find("lists no clients"), std::string::npos);
  EXPECT_THROW(read_tokens("/nonexistent/tokens.txt"), InvalidArgument);
}

}  // namespace
}  // namespace krab::federated
