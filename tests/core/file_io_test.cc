// Tests of core/file_io.h: exact reads and writes (a short file is a FormatError naming the path
// and the offset, a failed write an IoError naming the path, the byte count and the offset),
// opening with clear errors (missing files, links refused), whole-file reads, and atomic
// replacement that keeps the previous file when the new one cannot be written.
#include <gtest/gtest.h>
#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <fstream>
#include <string>

#include "core/error.h"
#include "core/file_io.h"

namespace strata {
namespace {

namespace fs = std::filesystem;

class FileIo : public ::testing::Test {
 protected:
  FileIo() {
    const char* base = std::getenv("TMPDIR");
    std::string templ = std::string(base != nullptr ? base : "/tmp") + "/strata-file-io-test-XXXXXX";
    if (::mkdtemp(templ.data()) == nullptr) throw std::runtime_error("mkdtemp failed for " + templ);
    dir_ = templ;
  }
  ~FileIo() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  std::string file(const std::string& name, const std::string& contents) const {
    const std::string path = dir_ + "/" + name;
    std::ofstream(path, std::ios::binary) << contents;
    return path;
  }
  static std::string slurp(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }
  std::string dir_;
};

TEST_F(FileIo, ReadExactReadsWhatIsThere) {
  const std::string path = file("data.bin", "0123456789");
  const UniqueFd fd = open_for_read(path, "test file");
  EXPECT_EQ(file_size_bytes(fd.get(), path), 10u);
  char buf[4] = {};
  read_exact(fd.get(), buf, 4, 3, path);
  EXPECT_EQ(std::string(buf, 4), "3456");
}

TEST_F(FileIo, AShortFileIsAFormatErrorNamingPathAndOffset) {
  const std::string path = file("short.bin", "0123456789");
  const UniqueFd fd = open_for_read(path, "test file");
  char buf[8] = {};
  try {
    read_exact(fd.get(), buf, 8, 6, path);
    ADD_FAILURE() << "reading past the end succeeded";
  } catch (const FormatError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(path), std::string::npos) << msg;
    EXPECT_NE(msg.find("truncated"), std::string::npos) << msg;
    EXPECT_NE(msg.find("offset 6"), std::string::npos) << msg;
    EXPECT_NE(msg.find("ends at byte 10"), std::string::npos) << msg;
  }
}

TEST_F(FileIo, WriteExactWritesAtTheOffset) {
  const std::string path = file("out.bin", "aaaaaaaa");
  UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CLOEXEC));
  ASSERT_TRUE(fd.valid());
  write_exact(fd.get(), "XYZ", 3, 2, path);
  fd.reset();
  EXPECT_EQ(slurp(path), "aaXYZaaa");
}

TEST_F(FileIo, AFailedWriteNamesPathByteCountAndOffset) {
  const std::string path = file("readonly.bin", "abc");
  const UniqueFd fd = open_for_read(path, "test file");  // writes fail with EBADF
  try {
    write_exact(fd.get(), "hello", 5, 4096, path);
    ADD_FAILURE() << "a write to a read-only descriptor succeeded";
  } catch (const IoError& e) {
    const std::string msg = e.what();
    EXPECT_EQ(e.errno_value(), EBADF);
    EXPECT_NE(msg.find(path), std::string::npos) << msg;
    EXPECT_NE(msg.find("5 bytes"), std::string::npos) << msg;
    EXPECT_NE(msg.find("offset 4096"), std::string::npos) << msg;
  }
  // write_error reads the same for a write failed before the kernel saw it.
  const IoError injected = write_error(path, 5, 4096, ENOSPC);
  EXPECT_EQ(injected.errno_value(), ENOSPC);
  EXPECT_NE(std::string(injected.what()).find(path), std::string::npos);
  EXPECT_NE(std::string(injected.what()).find("offset 4096"), std::string::npos);
}

TEST_F(FileIo, OpenErrorsNameTheFileAndRefuseLinksWhenAsked) {
  const std::string missing = dir_ + "/missing.bin";
  try {
    open_for_read(missing, "token file");
    ADD_FAILURE() << "opened a missing file";
  } catch (const IoError& e) {
    EXPECT_EQ(e.errno_value(), ENOENT);
    EXPECT_NE(std::string(e.what()).find("token file " + missing), std::string::npos) << e.what();
  }
  const std::string target = file("target.bin", "x");
  const std::string link = dir_ + "/link.bin";
  fs::create_symlink(target, link);
  EXPECT_NO_THROW(open_for_read(link, "test file"));
  try {
    open_for_read(link, "checkpoint file", Symlinks::Refuse);
    ADD_FAILURE() << "followed a link";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("symbolic link"), std::string::npos) << e.what();
  }
  EXPECT_THROW(create_new_file(target, "test file", 0600), IoError) << "an existing file is never reopened";
  EXPECT_THROW(fsync_directory(dir_ + "/no-such-dir"), IoError);
  EXPECT_NO_THROW(fsync_directory(dir_));
}

TEST_F(FileIo, ReadTextFileReadsWholeFilesOfAnySize) {
  std::string big(200'000, '\0');
  for (std::size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>('a' + i % 26);
  EXPECT_EQ(read_text_file(file("big.txt", big), "text file"), big);
  EXPECT_EQ(read_text_file(file("empty.txt", ""), "text file"), "");
  // stat says 0 bytes for /proc files; the text is read anyway.
  EXPECT_NE(read_text_file("/proc/self/status", "status file").find("Name:"), std::string::npos);
}

TEST_F(FileIo, ResizeFileTruncatesAndExtends) {
  const std::string path = file("resize.bin", "0123456789");
  UniqueFd fd(::open(path.c_str(), O_RDWR | O_CLOEXEC));
  ASSERT_TRUE(fd.valid());
  resize_file(fd.get(), path, 4);
  EXPECT_EQ(file_size_bytes(fd.get(), path), 4u);
  resize_file(fd.get(), path, 8192);
  EXPECT_EQ(file_size_bytes(fd.get(), path), 8192u);
}

TEST_F(FileIo, AtomicReplaceCommitsTheNewFile) {
  const std::string path = file("model.bin", "old contents");
  file("model.bin.tmp", "a crash's leftover");
  {
    AtomicFileWriter out(path, 0600);
    out.append("new ", 4);
    out.append("contents", 8);
    EXPECT_EQ(slurp(path), "old contents") << "replaced before commit";
    out.commit();
  }
  EXPECT_EQ(slurp(path), "new contents");
  EXPECT_FALSE(fs::exists(path + ".tmp"));
  struct stat st {};
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
}

TEST_F(FileIo, AtomicReplaceKeepsTheOldFileWhenTheWriteFails) {
  const std::string path = file("model.bin", "old contents");
  try {
    AtomicFileWriter out(path);
    out.append("partial", 7);
    out.append(nullptr, 64);  // EFAULT from the kernel: the write fails half-way
    out.commit();
    ADD_FAILURE() << "the failing write went through";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find(path + ".tmp"), std::string::npos) << e.what();
  }
  EXPECT_EQ(slurp(path), "old contents");
  EXPECT_FALSE(fs::exists(path + ".tmp")) << "the temporary is removed";
  // Nor does a writer abandoned without commit() touch the file.
  { AtomicFileWriter(path).append("x", 1); }
  EXPECT_EQ(slurp(path), "old contents");
  EXPECT_FALSE(fs::exists(path + ".tmp"));
}

TEST_F(FileIo, UniqueFdClosesOnceAndMoves) {
  UniqueFd a(::open("/dev/null", O_RDONLY | O_CLOEXEC));
  ASSERT_TRUE(a.valid());
  const int raw = a.get();
  UniqueFd b = std::move(a);
  EXPECT_FALSE(a.valid());  // NOLINT(bugprone-use-after-move): moved-from state is specified
  EXPECT_EQ(b.get(), raw);
  b.reset();
  EXPECT_FALSE(b.valid());
  EXPECT_EQ(::fcntl(raw, F_GETFD), -1) << "closed";
}

TEST_F(FileIo, FifosDirectoriesAndDevicesAreRefusedInsteadOfBlockingOrFailingVaguely) {
  // A FIFO would block the open (and the read) forever: refused at once, saying what it is.
  const std::string fifo = dir_ + "/data.fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  try {
    open_for_read(fifo, "token file");
    FAIL() << "a FIFO was opened for reading";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("not a regular file"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(fifo), std::string::npos) << e.what();
  }
  try {
    read_text_file(dir_, "fortune file");
    FAIL() << "a directory was read as a file";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("is a directory"), std::string::npos) << e.what();
  }
  EXPECT_THROW(open_for_read("/dev/null", "safetensors file"), IoError);
}

TEST_F(FileIo, EnsureDirectoryMakesTheLastComponentOnly) {
  ensure_directory(dir_ + "/made", "test directory");
  EXPECT_TRUE(fs::is_directory(dir_ + "/made"));
  ensure_directory(dir_ + "/made", "test directory");  // exists: nothing to do
  ensure_directory(dir_ + "/trailing/", "test directory");
  EXPECT_TRUE(fs::is_directory(dir_ + "/trailing"));
  try {
    ensure_directory(dir_ + "/typo/deeper", "nvme_path directory");
    FAIL() << "a chain of directories was made";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("only the last component"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(dir_ + "/typo"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(fs::exists(dir_ + "/typo"));
  const std::string plain = file("plain", "x");
  EXPECT_THROW(ensure_directory(plain, "test directory"), ConfigError);
}

TEST_F(FileIo, AtomicReplacementRefusesToReplaceAFifoOrDevice) {
  // The rename would put a regular file where the FIFO (or, as root, /dev/full) was.
  const std::string fifo = dir_ + "/out.fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  try {
    AtomicFileWriter w(fifo);
    FAIL() << "a FIFO was opened for atomic replacement";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("not a regular file"), std::string::npos) << e.what();
  }
  struct stat st {};
  ASSERT_EQ(::lstat(fifo.c_str(), &st), 0);
  EXPECT_TRUE(S_ISFIFO(st.st_mode));
  EXPECT_FALSE(fs::exists(fifo + ".tmp"));
}

}  // namespace
}  // namespace strata
