// sparsecp CLI: progress lines for a person at a terminal, so that a long command
// (run, calibrate, a simulate sweep, a bench) never sits silent for a minute.
//
// Lines go to stderr, each prefixed with the command and the seconds since it started
// ("sparsecp run [  12 s] calibrating ..."), and only when someone is watching: stderr
// is a terminal, or, under mpirun (which hands ranks a pipe for stderr), mpirun's own
// stderr is one. Never with --json, never when stderr is piped or redirected, so scripts
// and logs see exactly what they saw before. SPARSECP_PROGRESS=1 forces the lines on (the
// tests check them through a pipe), SPARSECP_PROGRESS=0 off.
#pragma once

#include <cstdarg>
#include <string>

namespace sparsecp::cli {

class Progress {
 public:
  // `command`: the prefix ("sparsecp run"); `quiet`: the command's output is for a
  // program (--json, CSV on stdout), so no progress whatever the terminal.
  Progress(std::string command, bool quiet);
  // A progress object that never prints (ranks other than 0).
  static Progress off();

  bool on() const { return on_; }
  double elapsed() const;
  // One line, printf-style; nothing when off.
  void say(const char* format, ...) const __attribute__((format(printf, 2, 3)));
  // The same, unless a line was printed less than a second ago (a fast loop's steps).
  void tick(const char* format, ...) const __attribute__((format(printf, 2, 3)));

 private:
  Progress() = default;
  std::string command_;
  bool on_ = false;
  double start_ = 0;
  mutable double last_ = -1e9;  // when the latest line was printed
  void print(const char* format, va_list arguments) const;
};

// Whether a person is watching stderr (see above), without the --json rule.
bool progress_wanted();

// "1 min 05 s", "42 s", "3.2 s": a duration for a person.
std::string human_seconds(double seconds);

}  // namespace sparsecp::cli
