/*
 * The FUSE helper library of agentvfs mounts: what pyfuse3 cannot tell or send.
 *
 * pyfuse3 does not pass a flush's process on, cannot answer an open with FOPEN_NOFLUSH, and
 * has no API for FUSE passthrough. This small library sits between pyfuse3 and libfuse.
 * Loaded with RTLD_GLOBAL before pyfuse3 is imported, its definitions of a few libfuse
 * functions are the ones pyfuse3 binds to:
 *
 * - fuse_session_new (libfuse < 3.17) or fuse_session_new_versioned (>= 3.17): wraps the
 *   flush callback, to record which process closed a descriptor (agentvfs_flush_pid: the
 *   mount publishes a file at its opener's close, not at the close of a child sharing the
 *   descriptor); the read callback, for handles read here (below); and, with libfuse >= 3.17,
 *   the init callback, to ask the kernel for passthrough (when the Python side asked for it)
 *   and to record whether the kernel granted it;
 * - fuse_session_mount: records the session's /dev/fuse descriptor, which the backing-file
 *   ioctls of passthrough go through;
 * - fuse_reply_open and fuse_reply_create: an open for reading only is answered with
 *   FOPEN_NOFLUSH (libfuse >= 3.11); with passthrough, the reply names the backing id the
 *   Python side registered for the handle (agentvfs_pt_attach);
 * - the read callback: a handle the Python side registered with a descriptor
 *   (agentvfs_serve: a clean file in the content cache or on local disk) is read here, from
 *   that descriptor, without a trip through Python; the Python side takes the registration
 *   back before anything changes what it serves.
 *
 * It is compiled for the libfuse pyfuse3 links, against that release's headers, on the
 * machine that mounts (agentvfs/mounts/_helper.py): AGENTVFS_FUSE_MINOR is its minor version.
 * Passthrough needs 3.17; everything else works with any libfuse 3.
 *
 * Every other call goes to libfuse unchanged. Nothing here allocates per request; a handle
 * stays in the pending table only between its attach and its open reply, so it holds at most
 * one entry per request served at once (max_tasks), far below its size.
 */
#ifndef AGENTVFS_FUSE_MINOR
#error "AGENTVFS_FUSE_MINOR (the minor version of libfuse 3) must be defined"
#endif
#if AGENTVFS_FUSE_MINOR >= 17
#define FUSE_USE_VERSION 317
#define HAVE_PASSTHROUGH 1
#else
#define FUSE_USE_VERSION 30
#define HAVE_PASSTHROUGH 0
#endif
/* FOPEN_NOFLUSH came with libfuse 3.11. */
#define HAVE_NOFLUSH (AGENTVFS_FUSE_MINOR >= 11)

#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <fuse_lowlevel.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <sys/ioctl.h>

#define PENDING_SLOTS 1024

/* The kernel's ABI (include/uapi/linux/fuse.h since Linux 6.9); older system headers lack it. */
struct backing_map {
    int32_t fd;
    uint32_t flags;
    uint64_t padding;
};
#define BACKING_OPEN _IOW(229, 1, struct backing_map)
#define BACKING_CLOSE _IOW(229, 2, uint32_t)

#if HAVE_PASSTHROUGH
typedef struct fuse_session *(*session_new_fn)(struct fuse_args *, const struct fuse_lowlevel_ops *, size_t,
                                               struct libfuse_version *, void *);
#else
typedef struct fuse_session *(*session_new_fn)(struct fuse_args *, const struct fuse_lowlevel_ops *, size_t, void *);
#endif
typedef int (*session_mount_fn)(struct fuse_session *, const char *);
typedef int (*reply_open_fn)(fuse_req_t, const struct fuse_file_info *);
typedef int (*reply_create_fn)(fuse_req_t, const struct fuse_entry_param *, const struct fuse_file_info *);
typedef void (*init_fn)(void *, struct fuse_conn_info *);
typedef void (*flush_fn)(fuse_req_t, fuse_ino_t, struct fuse_file_info *);
typedef void (*read_fn)(fuse_req_t, fuse_ino_t, size_t, off_t, struct fuse_file_info *);

static int requested;          /* ask the kernel for passthrough at init */
static int granted;            /* the kernel agreed */
static int session_fd = -1;    /* /dev/fuse of the mounted session */
static init_fn inner_init;     /* pyfuse3's init callback */
static flush_fn inner_flush;   /* pyfuse3's flush callback */
static read_fn inner_read;     /* pyfuse3's read callback */
static uint64_t flush_fh;      /* the handle of the flush being dispatched, and who sent it */
static pid_t flush_pid;
static struct fuse_lowlevel_ops wrapped_ops;
static int wrapped;            /* a session was created through wrap_ops */

static pthread_mutex_t pending_lock = PTHREAD_MUTEX_INITIALIZER;
static struct {
    uint64_t fh;
    int32_t backing_id; /* 0: free slot */
} pending[PENDING_SLOTS];

/*
 * Handles read from a descriptor here: an open-addressing table keyed by handle (handles
 * are never 0), with linear probing and deletion by backward shift. Filled to at most
 * three quarters; beyond that a handle is read through Python as before.
 */
#define SERVED_SLOTS 8192
static pthread_mutex_t served_lock = PTHREAD_MUTEX_INITIALIZER;
static struct {
    uint64_t fh; /* 0: free slot */
    int fd;
} served[SERVED_SLOTS];
static int served_count;

static size_t served_home(uint64_t fh)
{
    return (size_t)((fh * 0x9E3779B97F4A7C15ULL) >> 51) & (SERVED_SLOTS - 1);
}

/* The slot of fh, or -1 (under served_lock). */
static long served_find(uint64_t fh)
{
    for (size_t i = served_home(fh), n = 0; n < SERVED_SLOTS; i = (i + 1) & (SERVED_SLOTS - 1), n++) {
        if (served[i].fh == 0)
            return -1;
        if (served[i].fh == fh)
            return (long)i;
    }
    return -1;
}

static void *next_symbol(const char *name)
{
    return dlsym(RTLD_NEXT, name);
}

static void init_wrapper(void *userdata, struct fuse_conn_info *conn)
{
    if (inner_init != NULL)
        inner_init(userdata, conn);
    granted = 0;
#if HAVE_PASSTHROUGH
    if (!requested || !(conn->capable & FUSE_CAP_PASSTHROUGH))
        return;
    /* The kernel turns passthrough off when the writeback cache is on. */
    if (conn->want & FUSE_CAP_WRITEBACK_CACHE)
        return;
    conn->want |= FUSE_CAP_PASSTHROUGH;
    /* Backing files may live on a plain filesystem only, not on a stacked one. */
    conn->max_backing_stack_depth = 1;
    granted = 1;
#endif
}

/*
 * pyfuse3 starts the Python handler of a request right after this callback returns and
 * before it reads the next request, so the handler's first statement still sees the
 * values recorded here for its own handle.
 */
static void flush_wrapper(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
    const struct fuse_ctx *ctx = fuse_req_ctx(req);
    flush_fh = fi->fh;
    flush_pid = ctx != NULL ? ctx->pid : 0;
    inner_flush(req, ino, fi);
}

static void read_wrapper(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, struct fuse_file_info *fi)
{
    int fd = -1;
    pthread_mutex_lock(&served_lock);
    long slot = served_find(fi->fh);
    if (slot >= 0)
        fd = served[slot].fd;
    pthread_mutex_unlock(&served_lock);
    if (fd < 0) {
        inner_read(req, ino, size, off, fi);
        return;
    }
    /* libfuse reads the range from the descriptor (stopping at its end) into the reply. */
    struct fuse_bufvec buf = FUSE_BUFVEC_INIT(size);
    buf.buf[0].flags = FUSE_BUF_IS_FD | FUSE_BUF_FD_SEEK;
    buf.buf[0].fd = fd;
    buf.buf[0].pos = off;
    fuse_reply_data(req, &buf, 0);
}

/*
 * pyfuse3's callbacks, wrapped: a copy of its table with ours in their place. Returns the
 * table to hand to libfuse, or pyfuse3's own when this build does not know its size.
 */
static const struct fuse_lowlevel_ops *wrap_ops(const struct fuse_lowlevel_ops *op, size_t op_size)
{
    if (op_size > sizeof(wrapped_ops))
        return op;
    memset(&wrapped_ops, 0, sizeof(wrapped_ops));
    memcpy(&wrapped_ops, op, op_size);
    inner_init = wrapped_ops.init;
    wrapped_ops.init = init_wrapper;
    inner_flush = wrapped_ops.flush;
    if (inner_flush != NULL)
        wrapped_ops.flush = flush_wrapper;
    inner_read = wrapped_ops.read;
    if (inner_read != NULL)
        wrapped_ops.read = read_wrapper;
    /* A new session numbers its handles afresh: nothing registered before stands. */
    pthread_mutex_lock(&served_lock);
    memset(served, 0, sizeof(served));
    served_count = 0;
    pthread_mutex_unlock(&served_lock);
    granted = 0;
    session_fd = -1;
    wrapped = 1;
    return &wrapped_ops;
}

#if HAVE_PASSTHROUGH
struct fuse_session *fuse_session_new_versioned(struct fuse_args *args, const struct fuse_lowlevel_ops *op,
                                                size_t op_size, struct libfuse_version *version, void *userdata)
{
    session_new_fn real = (session_new_fn)next_symbol("fuse_session_new_versioned");
    if (real == NULL) {
        errno = ENOSYS;
        return NULL;
    }
    return real(args, wrap_ops(op, op_size), op_size, version, userdata);
}
#else
struct fuse_session *fuse_session_new(struct fuse_args *args, const struct fuse_lowlevel_ops *op, size_t op_size,
                                      void *userdata)
{
    session_new_fn real = (session_new_fn)next_symbol("fuse_session_new");
    if (real == NULL) {
        errno = ENOSYS;
        return NULL;
    }
    return real(args, wrap_ops(op, op_size), op_size, userdata);
}
#endif

int fuse_session_mount(struct fuse_session *se, const char *mountpoint)
{
    session_mount_fn real = (session_mount_fn)next_symbol("fuse_session_mount");
    if (real == NULL)
        return -1;
    int rc = real(se, mountpoint);
    session_fd = rc == 0 ? fuse_session_fd(se) : -1;
    return rc;
}

/* The backing id registered for fh, removed from the table; 0 when none. */
static int32_t take_pending(uint64_t fh)
{
    int32_t id = 0;
    pthread_mutex_lock(&pending_lock);
    for (int i = 0; i < PENDING_SLOTS; i++) {
        if (pending[i].backing_id != 0 && pending[i].fh == fh) {
            id = pending[i].backing_id;
            pending[i].backing_id = 0;
            break;
        }
    }
    pthread_mutex_unlock(&pending_lock);
    return id;
}

int fuse_reply_open(fuse_req_t req, const struct fuse_file_info *fi)
{
    reply_open_fn real = (reply_open_fn)next_symbol("fuse_reply_open");
    struct fuse_file_info copy = *fi;
#if HAVE_NOFLUSH
    /*
     * A descriptor opened only for reading has nothing to publish when it is closed (the
     * server takes no POSIX locks, which a flush would release): the kernel then sends no
     * FLUSH for it, one request less per file a reader goes through.
     */
    if ((fi->flags & O_ACCMODE) == O_RDONLY)
        copy.noflush = 1;
#endif
#if HAVE_PASSTHROUGH
    int32_t id = take_pending(fi->fh);
    if (id > 0) {
        copy.backing_id = id;
        copy.keep_cache = 0; /* no page cache of ours is involved */
    }
#endif
    return real(req, &copy);
}

int fuse_reply_create(fuse_req_t req, const struct fuse_entry_param *e, const struct fuse_file_info *fi)
{
    reply_create_fn real = (reply_create_fn)next_symbol("fuse_reply_create");
#if HAVE_PASSTHROUGH
    int32_t id = take_pending(fi->fh);
    if (id > 0) {
        struct fuse_file_info copy = *fi;
        copy.backing_id = id;
        copy.keep_cache = 0;
        return real(req, e, &copy);
    }
#endif
    return real(req, e, fi);
}

/* -- called from Python (ctypes) ------------------------------------------------------ */

/* The interface version _helper.py expects. */
int agentvfs_helper_version(void)
{
    return 5;
}

/* What this build can do: 1, passthrough (libfuse >= 3.17); 2, FOPEN_NOFLUSH (>= 3.11). */
int agentvfs_helper_features(void)
{
    return (HAVE_PASSTHROUGH ? 1 : 0) | (HAVE_NOFLUSH ? 2 : 0);
}

/* Whether a session was created through this library (pyfuse3 bound to its definitions). */
int agentvfs_helper_active(void)
{
    return wrapped;
}

/* Read handle fh from fd here until agentvfs_unserve(fh); 0, or -ENOSPC / -EINVAL. */
int agentvfs_serve(uint64_t fh, int fd)
{
    if (fh == 0 || fd < 0 || inner_read == NULL)
        return -EINVAL;
    int rc = -ENOSPC;
    pthread_mutex_lock(&served_lock);
    long slot = served_find(fh);
    if (slot >= 0) {
        served[slot].fd = fd;
        rc = 0;
    } else if (served_count < SERVED_SLOTS / 4 * 3) {
        size_t i = served_home(fh);
        while (served[i].fh != 0)
            i = (i + 1) & (SERVED_SLOTS - 1);
        served[i].fh = fh;
        served[i].fd = fd;
        served_count++;
        rc = 0;
    }
    pthread_mutex_unlock(&served_lock);
    return rc;
}

/* Read handle fh through Python again (nothing happens when it is not registered). */
void agentvfs_unserve(uint64_t fh)
{
    pthread_mutex_lock(&served_lock);
    long slot = served_find(fh);
    if (slot >= 0) {
        size_t hole = (size_t)slot;
        size_t j = hole;
        for (;;) {
            j = (j + 1) & (SERVED_SLOTS - 1);
            if (served[j].fh == 0)
                break;
            size_t home = served_home(served[j].fh);
            /* Move j back into the hole unless its home lies cyclically in (hole, j]. */
            int stays = hole <= j ? (hole < home && home <= j) : (hole < home || home <= j);
            if (!stays) {
                served[hole] = served[j];
                hole = j;
            }
        }
        served[hole].fh = 0;
        served[hole].fd = -1;
        served_count--;
    }
    pthread_mutex_unlock(&served_lock);
}

/* The thread id that sent the flush of handle fh being handled now (0: unknown). */
int agentvfs_flush_pid(uint64_t fh)
{
    return flush_fh == fh ? (int)flush_pid : 0;
}

void agentvfs_pt_request(int on)
{
    requested = on != 0;
}

int agentvfs_pt_granted(void)
{
    return granted && session_fd >= 0;
}

/* A backing id for the open descriptor fd, or -errno. */
int agentvfs_pt_open_backing(int fd)
{
    if (!granted || session_fd < 0)
        return -EOPNOTSUPP;
    struct backing_map map;
    memset(&map, 0, sizeof(map));
    map.fd = fd;
    int id = ioctl(session_fd, BACKING_OPEN, &map);
    return id > 0 ? id : -errno;
}

int agentvfs_pt_close_backing(int backing_id)
{
    if (session_fd < 0)
        return -EBADF;
    uint32_t id = (uint32_t)backing_id;
    return ioctl(session_fd, BACKING_CLOSE, &id) == 0 ? 0 : -errno;
}

/* Answer the next open or create of handle fh in passthrough to backing_id. */
int agentvfs_pt_attach(uint64_t fh, int backing_id)
{
    int rc = -ENOSPC;
    pthread_mutex_lock(&pending_lock);
    for (int i = 0; i < PENDING_SLOTS; i++) {
        if (pending[i].backing_id == 0) {
            pending[i].fh = fh;
            pending[i].backing_id = backing_id;
            rc = 0;
            break;
        }
    }
    pthread_mutex_unlock(&pending_lock);
    return rc;
}

/* Forget a registration whose open was never answered (the handler failed after attaching). */
void agentvfs_pt_detach(uint64_t fh)
{
    take_pending(fh);
}
