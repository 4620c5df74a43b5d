// Tests for client/progress_bar.h: the bar's text, and drawing on a stream only when enabled and
// only when the text changes.
#include "client/progress_bar.h"

#include <cstdint>
#include <cstdio>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trainerd::client {
namespace {

TEST(ProgressBarRenderTest, EmptyBarAtStartInKiB) {
  EXPECT_EQ(ProgressBar::Render(0, 2048), "[" + std::string(30, ' ') + "]   0% 0.0/2.0 KiB");
}

TEST(ProgressBarRenderTest, HalfwayFillsHalfTheBar) {
  EXPECT_EQ(ProgressBar::Render(1024, 2048),
            "[" + std::string(15, '#') + std::string(15, ' ') + "]  50% 1.0/2.0 KiB");
}

TEST(ProgressBarRenderTest, SmallTotalIsInBytes) {
  EXPECT_EQ(ProgressBar::Render(250, 1000),
            "[" + std::string(7, '#') + std::string(23, ' ') + "]  25% 250/1000 B");
}

TEST(ProgressBarRenderTest, UnitIsPickedByTheTotal) {
  const int64_t total = int64_t{27} * 1024 * 1024;
  EXPECT_EQ(ProgressBar::Render(total / 2, total),
            "[" + std::string(15, '#') + std::string(15, ' ') + "]  50% 13.5/27.0 MiB");
}

TEST(ProgressBarRenderTest, CompleteBarIsFull) {
  const int64_t total = int64_t{3} << 30;
  EXPECT_EQ(ProgressBar::Render(total, total), "[" + std::string(30, '#') + "] 100% 3.0/3.0 GiB");
}

TEST(ProgressBarRenderTest, ZeroTotalIsComplete) {
  EXPECT_EQ(ProgressBar::Render(0, 0), "[" + std::string(30, '#') + "] 100% 0/0 B");
}

TEST(ProgressBarRenderTest, OvershootIsClampedToFull) {
  EXPECT_EQ(ProgressBar::Render(4096, 2048), "[" + std::string(30, '#') + "] 100% 4.0/2.0 KiB");
}

TEST(ProgressBarBarTest, FillsByFractionAndClamps) {
  EXPECT_EQ(ProgressBar::Bar(0.3, 10), "[###       ]  30%");
  EXPECT_EQ(ProgressBar::Bar(-1, 4), "[    ]   0%");
  EXPECT_EQ(ProgressBar::Bar(2, 4), "[####] 100%");
}

// A temporary file for the bar to draw on; Contents() reads back what was written.
class ProgressBarDrawTest : public ::testing::Test {
 protected:
  ProgressBarDrawTest() : file_(std::tmpfile()) {}
  ~ProgressBarDrawTest() override {
    if (file_ != nullptr) std::fclose(file_);
  }

  std::string Contents() {
    std::fflush(file_);
    const long size = std::ftell(file_);
    std::string text(static_cast<size_t>(size), '\0');
    std::rewind(file_);
    const size_t read = std::fread(text.data(), 1, text.size(), file_);
    text.resize(read);
    std::fseek(file_, 0, SEEK_END);
    return text;
  }

  FILE* file_;
};

TEST_F(ProgressBarDrawTest, DrawsEachChangeOnceAndEndsTheLine) {
  ASSERT_NE(file_, nullptr);
  {
    ProgressBar bar(2048, /*enabled=*/true, file_);
    bar.Update(0);
    bar.Update(0);  // same text: not drawn again
    bar.Update(2048);
    bar.Finish();
  }
  EXPECT_EQ(Contents(),
            "\r" + ProgressBar::Render(0, 2048) + "\r" + ProgressBar::Render(2048, 2048) + "\n");
}

TEST_F(ProgressBarDrawTest, UpdatesAfterFinishDrawNothing) {
  ASSERT_NE(file_, nullptr);
  ProgressBar bar(2048, /*enabled=*/true, file_);
  bar.Update(1024);
  bar.Finish();
  const std::string after_finish = Contents();
  bar.Update(2048);
  bar.Finish();
  EXPECT_EQ(Contents(), after_finish);
  EXPECT_EQ(after_finish, "\r" + ProgressBar::Render(1024, 2048) + "\n");
}

TEST_F(ProgressBarDrawTest, DestructorEndsADrawnLine) {
  ASSERT_NE(file_, nullptr);
  { ProgressBar(2048, /*enabled=*/true, file_).Update(512); }
  EXPECT_EQ(Contents(), "\r" + ProgressBar::Render(512, 2048) + "\n");
}

TEST_F(ProgressBarDrawTest, NothingIsDrawnWhenNothingWasUpdated) {
  ASSERT_NE(file_, nullptr);
  { ProgressBar bar(2048, /*enabled=*/true, file_); }
  EXPECT_EQ(Contents(), "");
}

TEST_F(ProgressBarDrawTest, DisabledBarDrawsNothing) {
  ASSERT_NE(file_, nullptr);
  {
    ProgressBar bar(2048, /*enabled=*/false, file_);
    bar.Update(0);
    bar.Update(2048);
    bar.Finish();
  }
  EXPECT_EQ(Contents(), "");
}

}  // namespace
}  // namespace trainerd::client
