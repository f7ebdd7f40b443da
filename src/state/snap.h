/* snap.h — snapshots of what kvrouterd knows: the index (namespaces, tiers, every worker's
 * blocks) and every stream's sequence state, as one checksummed file, written atomically,
 * verified completely before anything is loaded, and fetched from a peer over HTTP.
 *
 * File (little-endian; version KVR_SNAP_VERSION; docs in docs/operations.md
 * "State and snapshots"):
 *   header (96 bytes): "KVRSNAP\0", u32 version, u32 header length, u64 created (Unix ms),
 *     u64 counts of namespaces, tiers, streams, workers, (holder, block) pairs, the producer
 *     ("kvrouterd X.Y.Z", 24 bytes), u64 xxh64 of the 88 bytes before it;
 *   sections: u32 type, u32 records, u64 length, u64 xxh64(payload), payload:
 *     NAMESPACES (model, LoRA, block size, in id order), TIERS (names in id order), then per
 *     writer one STREAMS section (pod, model, dp_rank, last seq, flags: unsynced and, from
 *     version 2, has-publisher-id, hybrid groups, the publisher id when flagged) and
 *     one WORKER section per worker (pod, dp_rank, the index's blob of its blocks), and END
 *     (xxh64 of every byte before the END section).
 *   Strings are u16 length, bytes, NUL.
 *
 * Loading never changes anything before the whole file verified (magic, version, every
 * checksum, every section parses, counts agree); a worker blob the index refuses while
 * restoring (it validates each before changing anything) makes the caller drop the index for
 * a fresh one (kvr_snap_boot does), so an index is either the snapshot's or empty.
 *
 * Threads: kvr_snap_take/save from any thread except an ingest writer (they wait for the
 * writers' parts); calls are serialized inside. The periodic thread is the module's own.
 * kvr_snap_verify/apply/boot: the main thread before ingest starts.
 *
 * Errors: negative errno with a human message in err.
 */
#ifndef KVR_SNAP_H
#define KVR_SNAP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/buf.h"
#include "core/err.h"
#include "index/index.h"
#include "events/ingest.h"

/* 2: a stream record may carry its engine's publisher id (flags bit 1); version 1 files
 * load as before. */
#define KVR_SNAP_VERSION 2
#define KVR_SNAP_FILE "snapshot.kvr"
#define KVR_SNAP_TMP "snapshot.tmp"

struct kvr_snap_info {
    uint32_t version;
    int64_t created_ms;     /* Unix ms */
    char producer[25];      /* "kvrouterd X.Y.Z" */
    uint64_t namespaces, tiers, streams, workers;
    uint64_t pairs;         /* (holder, block) pairs the index held when it was taken */
    uint64_t bytes;         /* file length */
};

/* Checks everything that can be checked without an index: magic, version (a newer one is
 * refused: -EPROTONOSUPPORT), header and section checksums, END's whole-file checksum,
 * every section's records parse, counts agree, nothing trails. -EINVAL (corrupt, truncated,
 * foreign) with the reason in err. info may be NULL. Pure function of the bytes. */
int kvr_snap_verify(const void *data, size_t len, struct kvr_snap_info *info,
                    struct kvr_err *err);

/* What a restore produced: the streams point into the snapshot bytes (keep them alive until
 * kvr_ingest_restore_streams copied them). */
struct kvr_snap_loaded {
    struct kvr_ingest_snap_stream *streams;
    size_t nstreams;
    struct kvr_snap_info info;
    uint64_t pairs;         /* (holder, block) pairs restored */
};
void kvr_snap_loaded_free(struct kvr_snap_loaded *l);

/* Verifies, then restores into ix, which must be empty (fresh from kvr_index_create): the
 * namespaces and tiers re-interned in id order, block sizes, each worker interned afresh and
 * its blob restored. On an error after the index was changed (a blob refused, ENOMEM) the
 * index is partly loaded: the caller must destroy it (kvr_snap_boot does). */
int kvr_snap_apply(const void *data, size_t len, struct kvr_index *ix, struct kvr_snap_loaded *out,
                   struct kvr_err *err);

/* ---- files ------------------------------------------------------------------------------ */

/* dir exists, is a directory, and a file can be created in it (a probe file is created and
 * removed). When dir is missing but its parent directory exists, as a fresh machine's
 * /var/lib/kvrouterd under /var/lib (systemd's StateDirectory makes it for the unit, nothing
 * does elsewhere):
 *   - create (startup): dir is made with mode 0750 (less what the umask takes), logged, then
 *     probed; a concurrent creator's EEXIST is not an error;
 *   - !create (kvrouterd -t, which changes nothing on disk): the parent must be a writable
 *     directory; returns 1, "would be created".
 * Returns 0 (usable), 1 (see above) or a negative errno with err set: -ENOENT (dir and its
 * parent missing), -ENOTDIR, -EACCES, -ENAMETOOLONG. */
int kvr_snap_check_dir(const char *dir, bool create, struct kvr_err *err);
/* Writes data to DIR/snapshot.tmp, fsyncs it, renames it to DIR/snapshot.kvr and fsyncs
 * DIR: a crash or a failed write (disk full) leaves the previous snapshot as it was. */
int kvr_snap_write_file(const char *dir, const void *data, size_t len, struct kvr_err *err);
/* The same from segments written in order (a snapshot is written from its parts without
 * assembling it in memory). */
struct kvr_snap_seg {
    const void *data;
    size_t len;
};
int kvr_snap_write_segs(const char *dir, const struct kvr_snap_seg *seg, size_t n,
                        struct kvr_err *err);
/* Reads a whole file into out (reset first). -ENOENT when absent. */
int kvr_snap_read_file(const char *path, struct kvr_buf *out, struct kvr_err *err);
/* Renames path aside to path.bad-<YYYYmmddTHHMMSS> (kept for inspection); the new name in
 * aside (may be NULL). */
int kvr_snap_set_aside(const char *path, char *aside, size_t cap);

/* ---- peers ------------------------------------------------------------------------------ */

/* GET http://HOST:PORT/v1/snapshot (plain HTTP/1.1, blocking, the whole exchange within
 * timeout_ms; token: a bearer token or NULL). The body must come with Content-Length. The
 * bytes in out are not verified here. */
int kvr_snap_fetch(const char *url, const char *token, int64_t timeout_ms, struct kvr_buf *out,
                   struct kvr_err *err);

/* ---- startup ---------------------------------------------------------------------------- */

struct kvr_snap_boot_opts {
    const char *dir;              /* NULL/"": no local snapshot */
    const char *bootstrap;        /* NULL or http://HOST:PORT of a peer */
    const char *token;            /* bearer token for the peer, or NULL */
    int64_t timeout_ms;           /* bootstrap fetch; default 30 s */
    struct kvr_index_opts index;  /* to create a fresh index when a restore fails */
};

/* What boot loaded: release with kvr_snap_boot_free after ingest copied the streams. */
/* What startup recovered, for /metrics (kvr_snap_opts.rec): the startup runs before the
 * HTTP listeners, so these are its results; the log lines say when each step starts and
 * ends. */
struct kvr_snap_recovery {
    const char *source;           /* "file", "peer" or "none" (a static string) */
    uint64_t streams, pairs;      /* restored */
    uint64_t load_ns;             /* time kvr_snap_apply took */
    bool bootstrap;               /* a peer was asked */
    bool bootstrap_ok;            /* and answered a valid snapshot */
    uint64_t bootstrap_ns, bootstrap_bytes;
};

struct kvr_snap_boot {
    struct kvr_buf bytes;         /* the snapshot (streams point into it) */
    struct kvr_snap_loaded loaded;
    const char *source;           /* "file", "peer" or NULL (nothing loaded) */
    struct kvr_snap_recovery rec; /* kept by kvr_snap_boot_free */
};
void kvr_snap_boot_free(struct kvr_snap_boot *b);

/* Startup: removes a stale snapshot.tmp, reads DIR/snapshot.kvr and verifies it (a bad one is
 * refused with one ERROR line and set aside); with bootstrap, fetches the peer's and keeps
 * the newer of the two (the peer's is then saved as the local one); restores the chosen one
 * into *ix (empty). A restore that fails midway destroys *ix and creates a fresh one (the
 * daemon starts empty, the file is set aside). Returns 0 whenever the daemon can go on
 * (with or without a snapshot); an error only for an unusable dir (missing, not writable)
 * or when no index can be created. */
int kvr_snap_boot(const struct kvr_snap_boot_opts *o, struct kvr_index **ix,
                  struct kvr_snap_boot *out, struct kvr_err *err);

/* ---- taking snapshots -------------------------------------------------------------------- */

struct kvr_snap;

struct kvr_snap_opts {
    const char *dir;              /* NULL/"": no files (kvr_snap_take still works) */
    int64_t interval_ms;          /* periodic snapshots; 0 = none (only kvr_snap_save) */
    struct kvr_index *index;
    struct kvr_ingest *ingest;
    struct kvr_snap_recovery rec; /* startup's results (kvr_snap_boot), for /metrics */
};

int kvr_snap_create(const struct kvr_snap_opts *o, struct kvr_snap **out, struct kvr_err *err);
/* Starts the periodic thread when dir and interval_ms > 0. */
int kvr_snap_start(struct kvr_snap *s, struct kvr_err *err);
/* Stops and joins it (a snapshot being written is finished first). Idempotent. */
void kvr_snap_stop(struct kvr_snap *s);
void kvr_snap_destroy(struct kvr_snap *s);

/* A fresh snapshot in out (reset first): every writer's part taken by the writer at a batch
 * boundary (kvr_ingest_snapshot), assembled here. */
int kvr_snap_take(struct kvr_snap *s, struct kvr_buf *out, struct kvr_err *err);
/* The same parts, written into dir as segments (kvr_snap_write_segs: never assembled in
 * memory, so a save holds the snapshot once); counted in the metrics, logged. -ENOTDIR
 * without dir. */
int kvr_snap_save(struct kvr_snap *s, struct kvr_err *err);

/* kvrouterd_snapshot_* lines (Prometheus text). */
void kvr_snap_metrics(struct kvr_snap *s, struct kvr_buf *out);

#endif
