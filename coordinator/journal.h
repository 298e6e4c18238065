// The coordinator's write-ahead journal: an append-only log of opaque records plus periodic
// snapshots, with group commit so that many concurrent writers share one fsync.
//
// On-disk layout in `dir`:
//   log-NNNNNN       records appended after snapshot NNNNNN (or from the start, for log-000001)
//   snapshot-NNNNNN  the caller's whole state before log-NNNNNN's first record
//   snapshot-NNNNNN.tmp  a snapshot being written; ignored by recovery
//   log-NNNNNN.torn-OFFSET  the bytes of a torn tail that recovery cut off, kept for inspection
// File format 2 (written): every file starts with a 16-byte header, "TSJOURNL", fixed32 LE
// format version (2), fixed32 LE file kind (1 log, 2 snapshot). Then records, each:
//   fixed32 LE payload length | fixed32 LE masked CRC32C(payload) |
//   fixed32 LE masked CRC32C(the 8 bytes before) | payload | end marker 0xA5
// The header checksum makes a damaged length detectable (format 1 had none, so one flipped
// byte could make every later record look like a torn tail); the end marker makes a record
// whose bytes all reached the disk recognisable. A snapshot file holds exactly one record.
// File format 1 (no file header; records: length | masked CRC32C(payload) | payload) is still
// read, strictly; a format-1 log is never appended to: Open starts the next log in format 2.
#ifndef TRAINSTEP_COORDINATOR_JOURNAL_H_
#define TRAINSTEP_COORDINATOR_JOURNAL_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/env.h"

namespace trainstep {

struct JournalOptions {
  // Metrics hook: the latency of each successful group-commit write+fsync done by Sync, called
  // from the syncing thread with no journal lock held. May be empty.
  std::function<void(double seconds)> on_fsync;
};

struct RecoveredJournal {
  std::optional<std::string> snapshot;  // Newest snapshot's bytes, if any.
  std::vector<std::string> records;     // Every intact record after it, in order.
  // E.g. "dropped torn record at /dir/log-000003 offset 4096 (12 bytes): <reason>".
  std::vector<std::string> warnings;
};

// Owns the journal directory while open (one Journal per directory). Thread-safe, except that
// WriteSnapshot must not race with Append (see there).
class Journal {
 public:
  // Creates `dir` if needed and recovers it into `*recovered` (may be null).
  //
  // Only a torn tail of the newest log is dropped: damage that a crash during its last,
  // unsynced append explains. A crash leaves a prefix of what was appended, possibly followed
  // by zero bytes (the file's size reached the disk before its data); it never alters bytes
  // that were fsynced, so it cannot damage an acknowledged record. Hence a tail is torn iff
  // it is an incomplete record header at EOF, a record whose (checksummed) length runs past
  // EOF, or a damaged record whose remaining bytes are all zero from inside it to EOF.
  // Dropped bytes that are not all zero are first copied to log-NNNNNN.torn-OFFSET (durably),
  // then the log is truncated durably so appends continue after the last intact record.
  // Anything else, including a complete last record whose checksum fails, returns
  // DataLossError naming the file, the offset and the problem, and changes nothing: the
  // journal must then be repaired or restored by hand. One Journal per directory at a time
  // (not enforced).
  static absl::StatusOr<std::unique_ptr<Journal>> Open(Env* env, std::string dir,
                                                       JournalOptions options,
                                                       RecoveredJournal* recovered);

  // Unsynced records are not written: they were never acknowledged.
  // No call may be in flight on another thread.
  ~Journal();

  Journal(const Journal&) = delete;
  Journal& operator=(const Journal&) = delete;

  // Queues one record (empty is fine) without I/O; returns its sequence number, 1, 2, ... within
  // this Journal object (numbering restarts at 1 after Open). A record of 4 GiB or more cannot
  // be framed and breaks the journal (every Sync then fails).
  uint64_t Append(std::string record);

  // Blocks until every record with sequence <= seq is written and fsynced. Group commit: while
  // one caller writes+fsyncs, later records queue up, and the next caller to sync writes all of
  // them with one write and one fsync. After a failed write or fsync the journal is broken: this
  // and every later Sync and WriteSnapshot return that error, and the owner must stop.
  // seq > last_appended() is INVALID_ARGUMENT.
  absl::Status Sync(uint64_t seq);

  uint64_t last_appended() const;
  // Records in the live log: recovered ones after the newest snapshot, plus those appended since.
  uint64_t records_since_snapshot() const;

  // Persists `snapshot`, the caller's whole state after every record appended so far, then
  // starts a new log and deletes the files it makes obsolete. The caller must not Append
  // concurrently (it holds its own lock). A failure before the snapshot is in place leaves the
  // journal usable; a failure after it breaks the journal, as an I/O error in Sync does.
  absl::Status WriteSnapshot(std::string_view snapshot);

 private:
  Journal(Env* env, std::string dir, JournalOptions options, uint64_t log_number,
          std::unique_ptr<WritableFile> log, uint64_t records_in_log);

  // Waits until no one else writes to disk and takes that role; then returns whether the
  // journal is healthy (broken_ otherwise).
  absl::Status BecomeWriterLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ReleaseWriterLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Writes and fsyncs everything pending. Requires the writer role; takes mu_ briefly.
  absl::Status WritePending() ABSL_LOCKS_EXCLUDED(mu_);
  // Marks the journal broken with `cause` and returns the annotated error.
  absl::Status Break(const absl::Status& cause) ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status SnapshotAsWriter(std::string_view snapshot) ABSL_LOCKS_EXCLUDED(mu_);

  Env* const env_;
  const std::string dir_;
  const JournalOptions options_;

  mutable absl::Mutex mu_;
  absl::CondVar writer_done_;  // Signalled whenever the writer role is released.
  // Framed records appended but not yet handed to a writer.
  std::string pending_ ABSL_GUARDED_BY(mu_);
  uint64_t last_appended_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t last_synced_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t records_since_snapshot_ ABSL_GUARDED_BY(mu_);
  // True while one thread does disk I/O; only that thread touches log_ and log_number_.
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  // Non-OK iff an I/O failure left the disk state unknown; then nothing more is written.
  absl::Status broken_ ABSL_GUARDED_BY(mu_);

  uint64_t log_number_;                // Guarded by the writer role.
  std::unique_ptr<WritableFile> log_;  // Guarded by the writer role.
};

}  // namespace trainstep

#endif  // TRAINSTEP_COORDINATOR_JOURNAL_H_
