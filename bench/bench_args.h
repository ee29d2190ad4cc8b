// Command-line helpers shared by the benchmarks: the command as typed and the date (recorded
// with every result) and comma-separated option lists.
#pragma once

#include <cstdio>
#include <ctime>
#include <string>
#include <vector>

namespace benchargs {

// argv joined with spaces.
inline std::string commandLine(int argc, char** argv) {
  std::string cmd;
  for (int i = 0; i < argc; ++i) cmd += (i ? " " : "") + std::string(argv[i]);
  return cmd;
}

// The current UTC time in strftime's `fmt` (default: ISO 8601, as the results' "date").
inline std::string utcNow(const char* fmt = "%Y-%m-%dT%H:%M:%SZ") {
  char buf[96];
  time_t t = time(nullptr);
  strftime(buf, sizeof(buf), fmt, gmtime(&t));
  return buf;
}

// A benchmark's JSON result file, opened with the head every result carries (benchmark,
// command, commit, device, SMs, date); the caller adds its own fields, then "results".
// nullptr, after a message, when the file cannot be written.
inline FILE* openJson(const std::string& path, const char* bench, int argc, char** argv,
                      const std::string& commit, const char* device, int sms) {
  FILE* f = fopen(path.c_str(), "w");
  if (f == nullptr) {
    fprintf(stderr, "cannot write %s\n", path.c_str());
    return nullptr;
  }
  fprintf(f,
          "{\n  \"benchmark\": \"%s\",\n  \"command\": \"%s\",\n  \"git_commit\": \"%s\",\n"
          "  \"device\": \"%s\",\n  \"sms\": %d,\n  \"date\": \"%s\",\n",
          bench, commandLine(argc, argv).c_str(), commit.c_str(), device, sms, utcNow().c_str());
  return f;
}

// The options every stand-alone benchmark takes, `--out F` and `--commit C`: true when argv[*i]
// is one of them with a value (the value taken, *i advanced past it).
inline bool outOrCommit(int argc, char** argv, int* i, std::string* out, std::string* commit) {
  const std::string s = argv[*i];
  if (*i + 1 >= argc || (s != "--out" && s != "--commit")) return false;
  *(s == "--out" ? out : commit) = argv[++*i];
  return true;
}

// "a,b,,c" -> {"a", "b", "c"}: the items of a comma list, empty ones dropped.
inline std::vector<std::string> splitList(const std::string& s) {
  std::vector<std::string> out;
  for (size_t p = 0; p <= s.size();) {
    size_t q = s.find(',', p);
    if (q == std::string::npos) q = s.size();
    if (q > p) out.push_back(s.substr(p, q - p));
    p = q + 1;
  }
  return out;
}

}  // namespace benchargs
