// JsonWriter: separators and nesting, string escaping, UTF-8 repair, numbers without a JSON form.

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>

#include "core/json_writer.h"

namespace {

using libcomm::jsonQuote;
using libcomm::JsonWriter;

TEST(JsonWriter, NestsObjectsAndArraysWithCommasInTheRightPlaces) {
  JsonWriter w;
  w.beginObject()
      .field("a", 1)
      .key("list")
      .beginArray()
      .value("x")
      .beginObject()
      .endObject()
      .beginArray()
      .endArray()
      .value(true)
      .null()
      .endArray()
      .key("o")
      .beginObject()
      .field("b", false)
      .field("c", -7LL)
      .endObject()
      .endObject();
  EXPECT_EQ(w.str(), R"({"a":1,"list":["x",{},[],true,null],"o":{"b":false,"c":-7}})");
}

TEST(JsonWriter, EscapesQuotesBackslashesAndControlCharacters) {
  EXPECT_EQ(jsonQuote("plain"), "\"plain\"");
  EXPECT_EQ(jsonQuote("say \"hi\" \\ there"), R"("say \"hi\" \\ there")");
  EXPECT_EQ(jsonQuote("a\nb\tc\rd\be\ff"), R"("a\nb\tc\rd\be\ff")");
  EXPECT_EQ(jsonQuote(std::string("nul\0x\x01\x1f", 7)), R"("nul\u0000x\u0001\u001f")");
  EXPECT_EQ(jsonQuote("/ and \x7f stay"), "\"/ and \x7f stay\"");
}

TEST(JsonWriter, KeepsValidUtf8AndReplacesBrokenBytes) {
  EXPECT_EQ(jsonQuote("Gr\xc3\xbc\xc3\x9f \xe2\x82\xac \xf0\x9f\x98\x80"),
            "\"Gr\xc3\xbc\xc3\x9f \xe2\x82\xac \xf0\x9f\x98\x80\"");
  EXPECT_EQ(jsonQuote("a\xff"
                      "b"),
            R"("a\ufffdb")");                                                 // never valid
  EXPECT_EQ(jsonQuote("\x80"), R"("\ufffd")");                                // stray continuation byte
  EXPECT_EQ(jsonQuote("\xc3"), R"("\ufffd")");                                // truncated at the end
  EXPECT_EQ(jsonQuote("\xc0\xaf"), R"("\ufffd\ufffd")");                      // overlong '/'
  EXPECT_EQ(jsonQuote("\xed\xa0\x80"), R"("\ufffd\ufffd\ufffd")");            // a surrogate
  EXPECT_EQ(jsonQuote("\xf4\x90\x80\x80"), R"("\ufffd\ufffd\ufffd\ufffd")");  // past U+10FFFF
}

TEST(JsonWriter, NumbersRoundTripAndNonFiniteBecomesNull) {
  JsonWriter w;
  w.beginArray()
      .value(0.1)
      .value(31.5)
      .value(std::nan(""))
      .value(std::numeric_limits<double>::infinity())
      .value(std::numeric_limits<unsigned long long>::max())
      .value(std::numeric_limits<long long>::min())
      .endArray();
  EXPECT_EQ(w.str(), "[0.1,31.5,null,null,18446744073709551615,-9223372036854775808]");
}

TEST(JsonWriter, KeysAreEscapedToo) {
  JsonWriter w;
  w.beginObject().field("we\"ird\n", "v").endObject();
  EXPECT_EQ(w.str(), R"({"we\"ird\n":"v"})");
}

}  // namespace
