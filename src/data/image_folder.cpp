// Listing an image folder: images.h's scan_image_folder. Nothing here opens an image; what is
// listed is a name, and whether it is a readable image is decided when it is read (image_codec).
#include <sys/stat.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <map>
#include <system_error>
#include <utility>

#include "core/errors.h"
#include "data/images.h"

namespace krab::data {
namespace {

namespace fs = std::filesystem;

bool is_image_name(const std::string& name) {
  std::string ext = fs::path(name).extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(),
                 [](unsigned char ch) { return static_cast<char>(std::tolower(ch)); });
  return ext == ".png" || ext == ".jpg" || ext == ".jpeg";
}

void check_root(const std::string& root) {
  std::error_code ec;
  KRAB_CHECK_ARG(fs::exists(root, ec), "image folder '", root, "' does not exist");
  KRAB_CHECK_ARG(fs::is_directory(root, ec), "image folder '", root,
                 "' is a file, not a directory (it should hold one folder per class)");
}

struct Entry {
  std::string name;
  bool folder = false;  // a directory, or a symbolic link to one
};

// Walks one split's folders. Each folder is read at most once, recognised by its device and
// inode: a symbolic link back to a parent would otherwise list the same images forever (or, for
// two links in one folder, 2^depth times before any bound on depth stopped it), and a second
// link to a folder already read would count its images twice. Both are refused, naming the
// link and the folder it repeats.
class Walk {
 public:
  explicit Walk(std::string root) : root_(std::move(root)) {}

  // The entries of `dir` whose names do not start with '.', sorted by name (byte order).
  std::vector<Entry> entries(const fs::path& dir) {
    enter(dir);
    std::vector<Entry> out;
    std::error_code ec;
    for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
      const std::string name = it->path().filename().string();
      std::error_code type_ec;  // a link to nothing is not a folder (and not an error here)
      if (name.rfind('.', 0) != 0) out.push_back({name, it->is_directory(type_ec)});
    }
    KRAB_CHECK_ARG(!ec, "image folder '", root_, "': cannot list '", dir.string(),
                   "': ", ec.message());
    std::sort(out.begin(), out.end(),
              [](const Entry& a, const Entry& b) { return a.name < b.name; });
    return out;
  }

  // Appends the image names below `dir` (`depth` folders below its class folder), as paths
  // relative to the class folder, to `out`.
  void images_below(const fs::path& dir, const std::string& relative, int depth,
                    std::vector<std::string>& out) {
    KRAB_CHECK_ARG(depth <= kMaxImageFolderDepth, "image folder '", root_, "': '", dir.string(),
                   "' is more than ", kMaxImageFolderDepth,
                   " folders below its class folder (images are looked for that deep at most)");
    for (const Entry& e : entries(dir)) {
      const std::string path = relative.empty() ? e.name : relative + "/" + e.name;
      if (e.folder)
        images_below(dir / e.name, path, depth + 1, out);
      else if (is_image_name(e.name))
        out.push_back(path);
    }
  }

 private:
  void enter(const fs::path& dir) {
    struct stat st {};
    if (::stat(dir.c_str(), &st) != 0) return;  // listing it names the problem
    const auto [at, fresh] = seen_.emplace(std::make_pair(st.st_dev, st.st_ino), dir.string());
    KRAB_CHECK_ARG(fresh, "image folder '", root_, "': '", dir.string(), "' is the folder '",
                   at->second,
                   "' again (a symbolic link to a folder already read; each folder is read once)");
  }

  std::string root_;
  std::map<std::pair<dev_t, ino_t>, std::string> seen_;  // folder -> the path it was read as
};

}  // namespace

ImageFolder scan_image_folder(const std::string& root, const std::vector<std::string>& classes) {
  check_root(root);
  Walk walk(root);
  ImageFolder out;
  out.root = root;
  std::vector<std::string> folders;
  for (const Entry& e : walk.entries(root))
    if (e.folder) folders.push_back(e.name);
  KRAB_CHECK_ARG(!folders.empty(), "image folder '", root,
                 "' has no class folders (expected ROOT/<class>/<image>.png|jpg)");
  out.classes = classes.empty() ? folders : classes;
  for (const std::string& name : folders) {
    const auto at = std::find(out.classes.begin(), out.classes.end(), name);
    KRAB_CHECK_ARG(at != out.classes.end(), "image folder '", root, "': class folder '", name,
                   "' is not one of the training classes");
    const fs::path dir = fs::path(root) / name;
    std::vector<std::string> files;
    walk.images_below(dir, "", 0, files);
    KRAB_CHECK_ARG(!files.empty(), "class folder '", dir.string(),
                   "' holds no .png, .jpg or .jpeg file");
    // Byte order of the path below the class folder: the same on every machine, and for a flat
    // class folder the order of the names as before.
    std::sort(files.begin(), files.end());
    for (const std::string& f : files) {
      out.files.push_back((dir / f).string());
      out.labels.push_back(at - out.classes.begin());
    }
  }
  return out;
}

}  // namespace krab::data
