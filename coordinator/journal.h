// The coordinator's write-ahead journal: an append-only log of opaque records plus periodic
// snapshots, with group commit so that many concurrent writers share one fsync.
//
// On-disk layout in `dir`:
//   log-NNNNNN       records, continuing log-(NNNNNN-1); each snapshot starts a new log
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

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
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
  // The outcome of each snapshot once its I/O is over: OK once it is in place, else why not;
  // `journal_broken` says the journal is now broken (the failure came after the rename, or
  // something else broke it meanwhile) until Resume mends it. `seconds`: from StartSnapshot
  // to the end. Called on the snapshot thread with no journal lock held, before
  // snapshot_in_progress() turns false, so it must not wait for a lock under which the owner
  // calls WaitForSnapshot or WriteSnapshot. May be empty.
  std::function<void(const absl::Status& outcome, bool journal_broken, double seconds)> on_snapshot;
};

struct RecoveredJournal {
  std::optional<std::string> snapshot;  // Newest snapshot's bytes, if any.
  std::vector<std::string> records;     // Every intact record after it, in order.
  // E.g. "dropped torn record at /dir/log-000003 offset 4096 (12 bytes): <reason>".
  std::vector<std::string> warnings;
};

// Owns the journal directory while open (one Journal per directory), and the thread that
// writes a snapshot. Thread-safe, except that StartSnapshot and WriteSnapshot must not race
// with Append or with each other: the caller serialises them under its own lock, so that the
// snapshot it passes is its state after exactly the records appended so far.
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

  // Waits for a snapshot being written (on_snapshot is called). Unsynced records are not
  // written: they were never acknowledged. No call may be in flight on another thread.
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
  // and every later Sync and snapshot return that error until Resume mends it. A snapshot's
  // log rotation (see StartSnapshot) is done by whichever writer comes first, maybe this one.
  // seq > last_appended() is INVALID_ARGUMENT.
  absl::Status Sync(uint64_t seq);

  uint64_t last_appended() const;
  // Records not covered by the newest snapshot in place: recovered ones after it, plus those
  // appended since (a snapshot being written counts once it is in place).
  uint64_t records_since_snapshot() const;

  // Starts persisting `snapshot`, the caller's whole state after every record appended so far,
  // and returns at once: memory work only, so the caller may hold its own lock (it must, see
  // the class comment). Records appended from now on go to a new log N+1 while those before
  // stay in log N; a background thread makes log N durable, starts log N+1, writes
  // snapshot-(N+1) beside it without blocking Append or Sync, then deletes the files it makes
  // obsolete, and reports through on_snapshot. Until the snapshot is renamed into place the
  // old snapshot and logs N and N+1 recover the same state, so a failure before then leaves the
  // journal usable (logs N and N+1 stay, and the next snapshot supersedes both); a failure
  // after it, or in starting log N+1, breaks the journal as an I/O error in Sync does.
  // OK also when a snapshot is already in progress: then nothing is started (try again later).
  // Not started: a broken journal (its error), a snapshot of 4 GiB or more (INVALID_ARGUMENT).
  absl::Status StartSnapshot(std::string snapshot);
  bool snapshot_in_progress() const;
  // Blocks until no snapshot is in progress; returns the last finished one's outcome (OK when
  // none ran).
  absl::Status WaitForSnapshot();
  // StartSnapshot, after waiting for one in progress, then WaitForSnapshot: the synchronous
  // form, with the same contract.
  absl::Status WriteSnapshot(std::string_view snapshot);

  // Whether an I/O failure broke the journal (its error), or OK.
  absl::Status broken() const;
  // Mends a broken journal without trusting the log it broke in: after a failed write or fsync
  // that file's contents are unknown (a retried fsync can report success for pages the kernel
  // dropped), so `snapshot`, the caller's whole state after every record appended so far, is
  // written as snapshot-M beside a new, empty log-M, M above every log number used, and every
  // older file becomes obsolete. On success the journal is healthy again: every record
  // appended so far counts as synced (the snapshot holds it) and appends go to log-M. On
  // failure it stays broken and this may be called again. OK when the journal is not broken.
  // Same contract as StartSnapshot: the caller appends nothing meanwhile.
  absl::Status Resume(std::string_view snapshot);

 private:
  Journal(Env* env, std::string dir, JournalOptions options, uint64_t log_number,
          std::unique_ptr<WritableFile> log, uint64_t records_in_log);

  // Waits until no one else writes to disk and takes that role; then returns whether the
  // journal is healthy (broken_ otherwise).
  absl::Status BecomeWriterLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ReleaseWriterLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Writes and fsyncs everything pending, rotating the log at rotation_ if one is due.
  // Requires the writer role; takes mu_ briefly.
  absl::Status WritePending() ABSL_LOCKS_EXCLUDED(mu_);
  // Makes log_ durable up to here, then starts log `number` and switches to it. Requires the
  // writer role.
  absl::Status RotateLog(std::string_view rest_of_old_log, uint64_t number)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Marks the journal broken with `cause` and returns the annotated error.
  absl::Status Break(const absl::Status& cause) ABSL_LOCKS_EXCLUDED(mu_);
  // The snapshot thread's body: WriteSnapshotFile, then the bookkeeping and on_snapshot.
  void RunSnapshot(std::string snapshot, uint64_t number, uint64_t covers_records,
                   std::chrono::steady_clock::time_point started) ABSL_LOCKS_EXCLUDED(mu_);
  // Rotates the log (unless a Sync did already), then writes snapshot-`number` and deletes
  // what it makes obsolete.
  absl::Status WriteSnapshotFile(std::string_view snapshot, uint64_t number)
      ABSL_LOCKS_EXCLUDED(mu_);

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

  // A log rotation that StartSnapshot asked for and no writer has done yet: the first
  // `pending_bytes` of pending_ belong to log_, the rest to log `number` (log_number_ + 1).
  struct Rotation {
    size_t pending_bytes;
    uint64_t number;
  };
  std::optional<Rotation> rotation_ ABSL_GUARDED_BY(mu_);
  // The log that records appended now will land in: log_number_, or rotation_->number.
  uint64_t append_log_number_ ABSL_GUARDED_BY(mu_);
  bool snapshot_running_ ABSL_GUARDED_BY(mu_) = false;
  absl::CondVar snapshot_done_;  // Signalled when snapshot_running_ turns false.
  absl::Status last_snapshot_ ABSL_GUARDED_BY(mu_);  // The last finished snapshot's outcome.
  // Runs RunSnapshot; touched only by StartSnapshot and Resume (serialised by their callers)
  // and ~Journal.
  std::thread snapshot_thread_;

  uint64_t log_number_;                // Guarded by the writer role.
  std::unique_ptr<WritableFile> log_;  // Guarded by the writer role.
};

}  // namespace trainstep

#endif  // TRAINSTEP_COORDINATOR_JOURNAL_H_
