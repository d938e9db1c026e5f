/*
 * stockade inner launcher.
 *
 *   stockade-launcher SPEC_FD -- CMD [ARGS...]
 *   stockade-launcher /SPEC_PATH -- CMD [ARGS...]
 *
 * bubblewrap execs this program after it has built the mount view (or, with the
 * container layer off, the runtime execs it directly).  It reads a spec from the
 * inherited file descriptor SPEC_FD (or, under gVisor, which passes no descriptors in,
 * from a file of the bundle's read-only rootfs), then, in this order:
 *
 *   0. makes the mounts the spec lists, in a mount namespace of its own: masks over
 *      secret files and directories, the workspace's protected paths bound onto
 *      themselves read-only, their parent directories pinned; bubblewrap then leaves it
 *      CAP_SYS_ADMIN and CAP_SETPCAP in the sandbox's own user namespace for this
 *      alone, and the launcher gives up every capability right after;
 *   a. refuses to go on if any capability is left (effective, permitted, ambient);
 *   b. sets no_new_privs;
 *   c. applies a Landlock ruleset (files layer);
 *   d. loads a seccomp filter given in the spec (syscalls layer);
 *   e. verifies the effect of each step;
 *   f. closes every inherited fd above 2;
 *   g. execs CMD.
 *
 * Why the launcher binds and not bubblewrap: bubblewrap 0.8 re-reads and parses
 * /proc/self/mountinfo for every bind it makes, so each of a run's ~30 binds costs more
 * than the one before (some 0.3 ms each); the new mount API (open_tree, mount_setattr,
 * move_mount, Linux 5.12) binds and makes read-only in three syscalls, with no lookup.
 *
 * Why C: the budget for this stage is 10 ms and a Python interpreter costs ~25 ms.
 * Only libc and kernel ABI constants are used; the Landlock definitions are written
 * out here because <linux/landlock.h> is missing or old on many build hosts.
 *
 * Spec format (version 1): a sequence of NUL-terminated records "K=VALUE":
 *
 *   "stockade-spec/1"   magic, must be first
 *   "L=0|1"             apply Landlock
 *   "S=0|1"             apply the Landlock scopes (abstract unix sockets, signals)
 *   "E=0|1"             seccomp is expected to be active before exec (verify Seccomp: 2)
 *   "D=0|1"             debug: report skipped paths and each step on stderr
 *   "r=/abs/path"       read+execute beneath this path (repeatable)
 *   "w=/abs/path"       every handled right beneath this path (repeatable)
 *   "d=/abs/path"       list directories (READ_DIR) beneath this path, nothing else:
 *                       a directory whose entries are granted one by one (repeatable)
 *   "p=/abs/path"       must-deny probe: opening it O_RDONLY must fail with EACCES
 *                       (default "/" when Landlock is on and no rule names "/")
 *   "k=/abs/path"       pin: bind the path onto itself (a mount point cannot be renamed)
 *   "b=/abs/path"       protect: bind the path onto itself read-only, recursively
 *   "n=/abs/path"       mask a file: bind /dev/null over it, read-only
 *   "t=/abs/path"       mask a directory: an empty read-only tmpfs over it
 *   "u=/abs/path"       the overlay layer directory (holding upper/ and work/) for
 *                       the o records after it
 *   "o=/abs/path"       mount an overlay over the path: the path itself is the lower
 *                       layer, every write lands in the layer's upper/ (userxattr)
 *                       (k, b, n, t and o records are applied in the order given)
 *   "N=0|1"             handle Landlock's TCP connect right (ABI 4): connecting is
 *                       refused but to the ports of "c" records (no namespace backend)
 *   "c=PORT"            a TCP port connect() may reach (repeatable; with N=1)
 *   "R=0|1"             reaper: stay the parent of the command as a child subreaper
 *                       (PR_SET_CHILD_SUBREAPER), and kill whatever of its tree is left
 *                       when it ends (no PID namespace to do it)
 *   "W=FD"              hold: read one byte from the inherited FD before anything
 *                       else (the runtime moves this process into its cgroup first)
 *   "B=N"               followed by exactly N raw bytes of struct sock_filter[]
 *   "F=FD"              learn mode: a unix socket to send the observer's listener over
 *   "P=N"               followed by N raw bytes: the observer's user-notification
 *                       filter, loaded last (after the verification) with
 *                       SECCOMP_FILTER_FLAG_NEW_LISTENER (enforce/observe.py)
 *   "A=N"               use at most Landlock ABI N, even where the kernel has more
 *                       (STOCKADE_LANDLOCK_ABI_MAX: it can only lower what is used)
 *   "G=0|1"             the F/P filter is the landlock backend's connect guard below
 *                       Landlock ABI 4 (enforce/netguard.py), not an observer: it is
 *                       loaded so that a notified call waits killably only, and once
 *                       the listener is handed over, connect(127.0.0.1:1) must be
 *                       refused with EACCES by the host's supervisor
 *   "X=1"               exec CMD with exactly the "e" records as its environment,
 *                       not the launcher's own (which is then the host's fixed one:
 *                       the launcher runs on the host before Landlock when there is
 *                       no bubblewrap, and a loader variable there would run first)
 *   "e=NAME=VALUE"      one variable of that environment (repeatable)
 *   "END"               terminator; nothing may follow
 *
 * Every failure before exec prints one line naming the operation and a fix, and
 * exits 125.  A failed exec exits 127 (not found) or 126 (other).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/filter.h>
#include <sched.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <dirent.h>
#include <sys/ioctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <sys/utsname.h>
#include <unistd.h>

#define EXIT_SETUP 125
#define EXIT_NOEXEC 126
#define EXIT_NOTFOUND 127

/* ---- Landlock ABI (include/uapi/linux/landlock.h), written out on purpose ---- */
#ifndef __NR_landlock_create_ruleset
#define __NR_landlock_create_ruleset 444
#endif
#ifndef __NR_landlock_add_rule
#define __NR_landlock_add_rule 445
#endif
#ifndef __NR_landlock_restrict_self
#define __NR_landlock_restrict_self 446
#endif
#ifndef __NR_close_range
#define __NR_close_range 436
#endif

#define LL_CREATE_RULESET_VERSION (1U << 0)
#define LL_RULE_PATH_BENEATH 1
#define LL_RULE_NET_PORT 2 /* ABI 4 */
#define LL_NET_BIND_TCP (1ULL << 0)
#define LL_NET_CONNECT_TCP (1ULL << 1)

#define LL_FS_EXECUTE (1ULL << 0)
#define LL_FS_WRITE_FILE (1ULL << 1)
#define LL_FS_READ_FILE (1ULL << 2)
#define LL_FS_READ_DIR (1ULL << 3)
#define LL_FS_REMOVE_DIR (1ULL << 4)
#define LL_FS_REMOVE_FILE (1ULL << 5)
#define LL_FS_MAKE_CHAR (1ULL << 6)
#define LL_FS_MAKE_DIR (1ULL << 7)
#define LL_FS_MAKE_REG (1ULL << 8)
#define LL_FS_MAKE_SOCK (1ULL << 9)
#define LL_FS_MAKE_FIFO (1ULL << 10)
#define LL_FS_MAKE_BLOCK (1ULL << 11)
#define LL_FS_MAKE_SYM (1ULL << 12)
#define LL_FS_REFER (1ULL << 13)    /* ABI 2 */
#define LL_FS_TRUNCATE (1ULL << 14) /* ABI 3 */
#define LL_FS_IOCTL_DEV (1ULL << 15) /* ABI 5 */

#define LL_SCOPE_ABSTRACT_UNIX_SOCKET (1ULL << 0) /* ABI 6 */
#define LL_SCOPE_SIGNAL (1ULL << 1)               /* ABI 6 */

/* Rights that make sense on a non-directory; the kernel rejects the others there. */
#define LL_FS_FILE_RIGHTS \
	(LL_FS_EXECUTE | LL_FS_WRITE_FILE | LL_FS_READ_FILE | LL_FS_TRUNCATE | LL_FS_IOCTL_DEV)
#define LL_FS_READ_RIGHTS (LL_FS_EXECUTE | LL_FS_READ_FILE | LL_FS_READ_DIR)

struct ll_ruleset_attr {
	uint64_t handled_access_fs;
	uint64_t handled_access_net; /* ABI 4; left 0: the network is the netns' job */
	uint64_t scoped;             /* ABI 6 */
};

struct ll_net_port_attr {
	uint64_t allowed_access;
	uint64_t port;
};

struct ll_path_beneath_attr {
	uint64_t allowed_access;
	int32_t parent_fd;
} __attribute__((packed));

/* ---- seccomp ABI ---- */
#ifndef SECCOMP_SET_MODE_FILTER
#define SECCOMP_SET_MODE_FILTER 1
#endif
#ifndef SECCOMP_MODE_FILTER
#define SECCOMP_MODE_FILTER 2
#endif
#ifndef PR_CAP_AMBIENT
#define PR_CAP_AMBIENT 47
#endif
/* ---- the new mount API (include/uapi/linux/mount.h), written out on purpose ---- */
#ifndef __NR_open_tree
#define __NR_open_tree 428
#endif
#ifndef __NR_move_mount
#define __NR_move_mount 429
#endif
#ifndef __NR_mount_setattr
#define __NR_mount_setattr 442
#endif
#ifndef __NR_fsopen
#define __NR_fsopen 430
#endif
#ifndef __NR_fsconfig
#define __NR_fsconfig 431
#endif
#ifndef __NR_fsmount
#define __NR_fsmount 432
#endif
#define MT_FSOPEN_CLOEXEC 0x00000001
#define MT_FSCONFIG_SET_FLAG 0
#define MT_FSCONFIG_SET_STRING 1
#define MT_FSCONFIG_CMD_CREATE 6
#define MT_FSMOUNT_CLOEXEC 0x00000001
#define MT_OPEN_TREE_CLONE 1
#define MT_AT_RECURSIVE 0x8000
#define MT_AT_EMPTY_PATH 0x1000
#define MT_MOVE_MOUNT_F_EMPTY_PATH 0x00000004
#define MT_MOVE_MOUNT_T_SYMLINKS 0x00000010
#define MT_ATTR_RDONLY 0x00000001
#define MT_ATTR_NOSUID 0x00000002
#define MT_ATTR_NODEV 0x00000004

struct mt_mount_attr {
	uint64_t attr_set;
	uint64_t attr_clr;
	uint64_t propagation;
	uint64_t userns_fd;
};

#define MAX_BPF_INSNS 4096
#define MAX_SPEC_BYTES (1 << 20)
#define MAX_PATHS 1024

struct spec {
	int landlock;
	int scope;
	int seccomp_expected;
	int debug;
	const char *read_paths[MAX_PATHS];
	size_t n_read;
	const char *write_paths[MAX_PATHS];
	size_t n_write;
	const char *list_paths[MAX_PATHS];
	size_t n_list;
	const char *deny_probe;
	const unsigned char *bpf;
	size_t bpf_len;
	int ctty;
	int drop_caps;
	int handle_net;
	int reaper;
	int hold_fd;
	/* F and P: the learn mode's observer (enforce/observe.py): a unix socket to send
	 * the listener of a seccomp user-notification filter over, and that filter */
	int observer_fd;
	const unsigned char *observer_bpf;
	size_t observer_bpf_len;
	int guard;
	uint64_t connect_ports[64];
	size_t n_connect;
	struct { int resource; rlim_t value; } rlimits[9];
	size_t n_rlimits;
	/* k (pin), b (protect), n and t (mask), o (overlay) records, in spec order */
	struct { char kind; const char *path; const char *layer; } binds[MAX_PATHS];
	const char *overlay_layer;
	size_t n_binds;
	/* X=1: the command's environment is envp (n_env entries, NULL-terminated) */
	int own_env;
	char **envp;
	size_t n_env;
};

static int g_debug;
/* A=N: the highest Landlock ABI to use (0: the kernel's) */
static int g_abi_max;

/* errno names, not strerror text: the message tells a user what to search for. */
static const char *errname(int e)
{
	switch (e) {
	case EPERM: return "EPERM";
	case ENOENT: return "ENOENT";
	case EINTR: return "EINTR";
	case EIO: return "EIO";
	case E2BIG: return "E2BIG";
	case EBADF: return "EBADF";
	case ENOMEM: return "ENOMEM";
	case EACCES: return "EACCES";
	case EFAULT: return "EFAULT";
	case EBUSY: return "EBUSY";
	case EEXIST: return "EEXIST";
	case ENOTDIR: return "ENOTDIR";
	case EINVAL: return "EINVAL";
	case ENFILE: return "ENFILE";
	case EMFILE: return "EMFILE";
	case ENOSPC: return "ENOSPC";
	case ESPIPE: return "ESPIPE";
	case EROFS: return "EROFS";
	case ENOSYS: return "ENOSYS";
	case ELOOP: return "ELOOP";
	case ENAMETOOLONG: return "ENAMETOOLONG";
	case EOPNOTSUPP: return "EOPNOTSUPP";
	default: return "unknown errno";
	}
}

static void die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));

static void die(const char *fmt, ...)
{
	char line[1024];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(line, sizeof line, fmt, ap);
	va_end(ap);
	/* One line on stderr, then the documented exit code for a stockade error. */
	dprintf(2, "stockade: %s\n", line);
	_exit(EXIT_SETUP);
}

static void debug(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void debug(const char *fmt, ...)
{
	char line[1024];
	va_list ap;
	if (!g_debug)
		return;
	va_start(ap, fmt);
	vsnprintf(line, sizeof line, fmt, ap);
	va_end(ap);
	dprintf(2, "stockade-launcher: %s\n", line);
}

static int parse_flag(const char *v, const char *key)
{
	if (strcmp(v, "0") == 0)
		return 0;
	if (strcmp(v, "1") == 0)
		return 1;
	die("bad spec: %s=%s is not 0 or 1; rebuild the spec with stockade.enforce.launcher", key, v);
}

/* Read the whole spec; the fd may be a memfd (seekable) or a pipe (not). */
static char *read_spec(int fd, size_t *len_out)
{
	size_t cap = 4096, len = 0;
	char *buf = malloc(cap + 1);
	if (!buf)
		die("reading the spec failed: ENOMEM; free memory");
	/* A memfd written by the caller has its offset at the end: rewind it. */
	if (lseek(fd, 0, SEEK_SET) < 0 && errno != ESPIPE)
		die("lseek on spec fd %d failed: %s; pass a memfd or a pipe", fd, errname(errno));
	for (;;) {
		if (len == cap) {
			if (cap >= MAX_SPEC_BYTES)
				die("reading the spec failed: larger than %d bytes; pass fewer paths",
				    MAX_SPEC_BYTES);
			cap *= 2;
			char *n = realloc(buf, cap + 1);
			if (!n)
				die("reading the spec failed: ENOMEM; free memory");
			buf = n;
		}
		ssize_t r = read(fd, buf + len, cap - len);
		if (r < 0) {
			if (errno == EINTR)
				continue;
			die("read on spec fd %d failed: %s; pass the spec fd with pass_fds", fd,
			    errname(errno));
		}
		if (r == 0)
			break;
		len += (size_t)r;
	}
	buf[len] = '\0';
	*len_out = len;
	return buf;
}

static void parse_spec(char *buf, size_t len, struct spec *s)
{
	size_t off = 0;
	int first = 1, ended = 0;
	memset(s, 0, sizeof *s);
	while (off < len) {
		char *rec = buf + off;
		size_t rlen = strnlen(rec, len - off);
		if (rlen == len - off)
			die("bad spec: record at byte %zu is not NUL-terminated; rebuild the spec", off);
		off += rlen + 1;
		if (first) {
			if (strcmp(rec, "stockade-spec/1") != 0)
				die("bad spec: magic is not stockade-spec/1; launcher and library versions differ, rebuild the launcher");
			first = 0;
			continue;
		}
		if (strcmp(rec, "END") == 0) {
			ended = 1;
			break;
		}
		if (rlen < 2 || rec[1] != '=')
			die("bad spec: record \"%.40s\" is not K=VALUE; rebuild the spec", rec);
		const char *v = rec + 2;
		switch (rec[0]) {
		case 'L': s->landlock = parse_flag(v, "L"); break;
		case 'S': s->scope = parse_flag(v, "S"); break;
		case 'E': s->seccomp_expected = parse_flag(v, "E"); break;
		case 'D': s->debug = parse_flag(v, "D"); break;
		case 'T': s->ctty = parse_flag(v, "T"); break;
		case 'C': s->drop_caps = parse_flag(v, "C"); break;
		case 'X': s->own_env = parse_flag(v, "X"); break;
		case 'e': {
			if (!strchr(v, '='))
				die("bad spec: environment record \"%.40s\" is not NAME=VALUE; rebuild the spec", v);
			char **n = realloc(s->envp, (s->n_env + 2) * sizeof *n);
			if (!n)
				die("reading the spec failed: ENOMEM; free memory");
			s->envp = n;
			s->envp[s->n_env++] = (char *)v;
			s->envp[s->n_env] = NULL;
			break;
		}
		case 'N': s->handle_net = parse_flag(v, "N"); break;
		case 'R': s->reaper = parse_flag(v, "R"); break;
		case 'G': s->guard = parse_flag(v, "G"); break;
		case 'A': {
			char *aend;
			errno = 0;
			long n = strtol(v, &aend, 10);
			if (errno || *aend || n < 1 || n > 1000)
				die("bad spec: Landlock ABI cap \"%.20s\" is not a number above 0", v);
			g_abi_max = (int)n;
			break;
		}
		case 'W': {
			char *wend;
			errno = 0;
			long fd = strtol(v, &wend, 10);
			if (errno || *wend || fd < 3 || fd > 1 << 20)
				die("bad spec: hold fd \"%.20s\" is not an inherited fd above 2", v);
			s->hold_fd = (int)fd;
			break;
		}
		case 'F': {
			char *fend;
			errno = 0;
			long fd = strtol(v, &fend, 10);
			if (errno || *fend || fd < 3 || fd > 1 << 20)
				die("bad spec: observer fd \"%.20s\" is not an inherited fd above 2", v);
			s->observer_fd = (int)fd;
			break;
		}
		case 'P': {
			char *qend;
			errno = 0;
			unsigned long n = strtoul(v, &qend, 10);
			if (errno || *qend || n == 0 || n % sizeof(struct sock_filter) ||
			    n / sizeof(struct sock_filter) > MAX_BPF_INSNS || n > len - off)
				die("bad spec: observer program length %.20s is invalid; rebuild it with stockade.enforce.observe",
				    v);
			s->observer_bpf = (const unsigned char *)buf + off;
			s->observer_bpf_len = n;
			off += n;
			break;
		}
		case 'c': {
			char *pend;
			errno = 0;
			unsigned long port = strtoul(v, &pend, 10);
			if (errno || *pend || v[0] == '\0' || port > 65535 ||
			    s->n_connect == sizeof s->connect_ports / sizeof s->connect_ports[0])
				die("bad spec: connect port \"%.20s\" invalid or too many; rebuild the spec", v);
			s->connect_ports[s->n_connect++] = port;
			break;
		}
		case 'l': {
			/* l=NAME:VALUE, an rlimit set as both soft and hard limit. */
			static const struct { const char *name; int resource; } names[] = {
				{"nproc", RLIMIT_NPROC}, {"as", RLIMIT_AS}, {"fsize", RLIMIT_FSIZE},
				{"cpu", RLIMIT_CPU}, {"nofile", RLIMIT_NOFILE}, {"core", RLIMIT_CORE},
				{"data", RLIMIT_DATA},
			};
			const char *colon = strchr(v, ':');
			char *vend;
			int resource = -1;
			for (size_t i = 0; colon && i < sizeof names / sizeof names[0]; i++)
				if (strlen(names[i].name) == (size_t)(colon - v) &&
				    strncmp(names[i].name, v, (size_t)(colon - v)) == 0)
					resource = names[i].resource;
			if (resource < 0 || s->n_rlimits == sizeof s->rlimits / sizeof s->rlimits[0])
				die("bad spec: rlimit \"%.40s\" unknown or too many; rebuild the spec", v);
			errno = 0;
			unsigned long long value = strtoull(colon + 1, &vend, 10);
			if (errno || *vend || colon[1] == '\0')
				die("bad spec: rlimit value in \"%.40s\" is not a number; rebuild the spec", v);
			s->rlimits[s->n_rlimits].resource = resource;
			s->rlimits[s->n_rlimits].value = (rlim_t)value;
			s->n_rlimits++;
			break;
		}
		case 'u':
			if (v[0] != '/')
				die("bad spec: path \"%.200s\" is not absolute; pass absolute paths", v);
			s->overlay_layer = v;
			break;
		case 'k':
		case 'b':
		case 'n':
		case 't':
		case 'o':
			if (v[0] != '/')
				die("bad spec: path \"%.200s\" is not absolute; pass absolute paths", v);
			if (s->n_binds == MAX_PATHS)
				die("bad spec: more than %d mounts; protect or mask parent directories", MAX_PATHS);
			if (rec[0] == 'o' && !s->overlay_layer)
				die("bad spec: overlay over %.200s before its layer (u=); rebuild the spec", v);
			s->binds[s->n_binds].kind = rec[0];
			s->binds[s->n_binds].path = v;
			s->binds[s->n_binds].layer = rec[0] == 'o' ? s->overlay_layer : NULL;
			s->n_binds++;
			break;
		case 'd':
			if (v[0] != '/')
				die("bad spec: path \"%.200s\" is not absolute; pass absolute paths", v);
			if (s->n_list == MAX_PATHS)
				die("bad spec: more than %d list paths; pass parent directories", MAX_PATHS);
			s->list_paths[s->n_list++] = v;
			break;
		case 'r':
		case 'w':
		case 'p':
			if (v[0] != '/')
				die("bad spec: path \"%.200s\" is not absolute; pass absolute paths", v);
			if (rec[0] == 'p') {
				s->deny_probe = v;
			} else if (rec[0] == 'r') {
				if (s->n_read == MAX_PATHS)
					die("bad spec: more than %d read paths; pass parent directories", MAX_PATHS);
				s->read_paths[s->n_read++] = v;
			} else {
				if (s->n_write == MAX_PATHS)
					die("bad spec: more than %d write paths; pass parent directories", MAX_PATHS);
				s->write_paths[s->n_write++] = v;
			}
			break;
		case 'B': {
			char *end;
			errno = 0;
			unsigned long n = strtoul(v, &end, 10);
			if (errno || *end || n == 0 || n % sizeof(struct sock_filter) ||
			    n / sizeof(struct sock_filter) > MAX_BPF_INSNS || n > len - off)
				die("bad spec: seccomp program length %.20s is invalid; rebuild it with stockade.enforce.seccomp",
				    v);
			s->bpf = (const unsigned char *)buf + off;
			s->bpf_len = n;
			off += n;
			break;
		}
		default:
			die("bad spec: unknown key '%c'; launcher and library versions differ, rebuild the launcher",
			    rec[0]);
		}
	}
	if (first || !ended)
		die("bad spec: truncated (no END record); pass the whole spec");
	if (off != len)
		die("bad spec: %zu bytes after END; rebuild the spec", len - off);
	if (s->bpf)
		s->seccomp_expected = 1;
}

/* Parse "Key:\tVALUE" from a /proc/self/status text. */
static const char *status_field(const char *text, const char *key)
{
	size_t klen = strlen(key);
	const char *p = text;
	while (p && *p) {
		if (strncmp(p, key, klen) == 0 && p[klen] == ':') {
			p += klen + 1;
			while (*p == ' ' || *p == '\t')
				p++;
			return p;
		}
		p = strchr(p, '\n');
		if (p)
			p++;
	}
	return NULL;
}

/* Re-read the status through an fd opened before Landlock, so /proc need not be allowed. */
static void read_status(int fd, char *buf, size_t cap)
{
	size_t len = 0;
	ssize_t r;
	if (lseek(fd, 0, SEEK_SET) < 0)
		die("lseek on /proc/self/status failed: %s; mount a fresh /proc (bwrap --proc /proc)",
		    errname(errno));
	while (len + 1 < cap && (r = read(fd, buf + len, cap - 1 - len)) != 0) {
		if (r < 0) {
			if (errno == EINTR)
				continue;
			die("read of /proc/self/status failed: %s; mount a fresh /proc (bwrap --proc /proc)",
			    errname(errno));
		}
		len += (size_t)r;
	}
	buf[len] = '\0';
}

static unsigned long long status_hex(const char *text, const char *key)
{
	const char *v = status_field(text, key);
	if (!v)
		die("/proc/self/status has no %s line; mount a fresh /proc (bwrap --proc /proc)", key);
	return strtoull(v, NULL, 16);
}

static long status_long(const char *text, const char *key)
{
	const char *v = status_field(text, key);
	if (!v)
		die("/proc/self/status has no %s line; mount a fresh /proc (bwrap --proc /proc)", key);
	return strtol(v, NULL, 10);
}

static int landlock_abi(void)
{
	long abi = syscall(__NR_landlock_create_ruleset, NULL, 0, LL_CREATE_RULESET_VERSION);
	if (abi < 0) {
		if (errno == ENOSYS)
			die("landlock_create_ruleset failed: ENOSYS (kernel without CONFIG_SECURITY_LANDLOCK or landlock not in lsm=); use --disable files to run without it");
		if (errno == EOPNOTSUPP)
			die("landlock_create_ruleset failed: EOPNOTSUPP (Landlock is built in but disabled at boot); add landlock to the lsm= kernel parameter or use --disable files");
		die("landlock_create_ruleset(version) failed: %s; use --disable files to run without it",
		    errname(errno));
	}
	/* Rights of a newer ABI are left unhandled below the cap, as on an older kernel. */
	if (g_abi_max && abi > g_abi_max)
		abi = g_abi_max;
	return (int)abi;
}

static uint64_t handled_fs_for_abi(int abi)
{
	/* Handle every right this kernel knows: an unhandled right is silently allowed. */
	if (abi >= 5)
		return (LL_FS_IOCTL_DEV << 1) - 1;
	if (abi >= 3)
		return (LL_FS_TRUNCATE << 1) - 1;
	if (abi == 2)
		return (LL_FS_REFER << 1) - 1;
	return (LL_FS_MAKE_SYM << 1) - 1;
}

static void add_path_rule(int ruleset, const char *path, uint64_t access, const char *kind)
{
	struct stat st;
	struct ll_path_beneath_attr pb;
	/* O_PATH: a rule needs an fd naming the inode, not read permission on it. */
	int fd = open(path, O_PATH | O_CLOEXEC);
	if (fd < 0) {
		if (errno == ENOENT) {
			debug("skipping %s path %s: does not exist", kind, path);
			return;
		}
		die("open(%s) for a Landlock %s rule failed: %s; remove it from the policy or make it reachable",
		    path, kind, errname(errno));
	}
	if (fstat(fd, &st) < 0)
		die("fstat(%s) failed: %s; remove it from the policy", path, errname(errno));
	/* Directory-only rights on a file make add_rule fail with EINVAL: keep file rights. */
	if (!S_ISDIR(st.st_mode))
		access &= LL_FS_FILE_RIGHTS;
	pb.allowed_access = access;
	pb.parent_fd = fd;
	if (syscall(__NR_landlock_add_rule, ruleset, LL_RULE_PATH_BENEATH, &pb, 0) < 0)
		die("landlock_add_rule(%s, %s) failed: %s; remove the path from the policy or report a bug",
		    kind, path, errname(errno));
	close(fd);
	debug("landlock %s rule: %s", kind, path);
}

static void apply_landlock(const struct spec *s)
{
	struct ll_ruleset_attr attr;
	size_t attr_size;
	int abi = landlock_abi();
	uint64_t handled = handled_fs_for_abi(abi);
	size_t i;

	memset(&attr, 0, sizeof attr);
	attr.handled_access_fs = handled;
	/* Older kernels take the shorter struct; pass only the fields this ABI knows. */
	attr_size = offsetof(struct ll_ruleset_attr, handled_access_net);
	if (s->handle_net) {
		/* Without a network namespace, Landlock's TCP rules are what keeps connect()
		 * to the proxy's port; a kernel without them must not run the command. */
		if (abi < 4)
			die("Landlock network rules need ABI 4 (Linux 6.7), this kernel has ABI %d; the landlock backend cannot confine the network here: upgrade the kernel or use the bubblewrap backend",
			    abi);
		attr.handled_access_net = LL_NET_CONNECT_TCP;
		attr_size = offsetof(struct ll_ruleset_attr, scoped);
	}
	if (s->scope) {
		if (abi < 6)
			die("Landlock scopes need ABI 6 (Linux 6.12), this kernel has ABI %d; upgrade the kernel or turn off the scope option",
			    abi);
		/* Scopes stop connecting to abstract unix sockets and signalling processes
		 * outside the sandbox's Landlock domain: both bypass path rules. */
		attr.scoped = LL_SCOPE_ABSTRACT_UNIX_SOCKET | LL_SCOPE_SIGNAL;
		attr_size = sizeof attr;
	}
	int ruleset = (int)syscall(__NR_landlock_create_ruleset, &attr, attr_size, 0);
	if (ruleset < 0)
		die("landlock_create_ruleset failed: %s; use --disable files to run without it",
		    errname(errno));
	debug("landlock ABI %d, handled 0x%llx, scoped 0x%llx", abi,
	      (unsigned long long)handled, (unsigned long long)attr.scoped);

	for (i = 0; i < s->n_connect; i++) {
		struct ll_net_port_attr np = {LL_NET_CONNECT_TCP, s->connect_ports[i]};
		if (syscall(__NR_landlock_add_rule, ruleset, LL_RULE_NET_PORT, &np, 0) < 0)
			die("landlock_add_rule(net port %llu) failed: %s; report a bug",
			    (unsigned long long)s->connect_ports[i], errname(errno));
		debug("landlock connect rule: TCP port %llu", (unsigned long long)s->connect_ports[i]);
	}
	for (i = 0; i < s->n_read; i++)
		add_path_rule(ruleset, s->read_paths[i], LL_FS_READ_RIGHTS & handled, "read");
	for (i = 0; i < s->n_list; i++)
		add_path_rule(ruleset, s->list_paths[i], LL_FS_READ_DIR, "list");
	/* Write paths get every handled right, REFER/TRUNCATE/IOCTL_DEV included, so that
	 * renames inside the workspace, truncation and terminal ioctls keep working. */
	for (i = 0; i < s->n_write; i++)
		add_path_rule(ruleset, s->write_paths[i], handled, "write");

	/* restrict_self needs no_new_privs (set before) and binds this thread only;
	 * the launcher is single-threaded and the domain is inherited across exec. */
	if (syscall(__NR_landlock_restrict_self, ruleset, 0) < 0)
		die("landlock_restrict_self failed: %s; check that no_new_privs is set and the kernel allows nesting (max 16 layers)",
		    errname(errno));
	close(ruleset);
}

static void load_seccomp(const struct spec *s)
{
	struct sock_fprog prog;
	prog.len = (unsigned short)(s->bpf_len / sizeof(struct sock_filter));
	/* The spec buffer is suitably aligned (malloc) only at its start, so copy. */
	struct sock_filter *insns = malloc(s->bpf_len);
	if (!insns)
		die("loading the seccomp filter failed: ENOMEM; free memory");
	memcpy(insns, s->bpf, s->bpf_len);
	prog.filter = insns;
#ifdef SYS_seccomp
	if (syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, &prog) == 0) {
		free(insns);
		return;
	}
	if (errno != ENOSYS)
		die("seccomp(SECCOMP_SET_MODE_FILTER) failed: %s; rebuild the filter or use --disable syscalls",
		    errname(errno));
#endif
	/* Kernels before 3.17 only have the prctl interface. */
	if (prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog, 0, 0) != 0)
		die("prctl(PR_SET_SECCOMP) failed: %s (kernel without CONFIG_SECCOMP_FILTER?); use --disable syscalls",
		    errname(errno));
	free(insns);
}

#ifndef SECCOMP_FILTER_FLAG_NEW_LISTENER
#define SECCOMP_FILTER_FLAG_NEW_LISTENER (1UL << 3)
#endif

#ifndef SECCOMP_FILTER_FLAG_WAIT_KILLABLE_RECV
#define SECCOMP_FILTER_FLAG_WAIT_KILLABLE_RECV (1UL << 5)
#endif

/* Load the user-notification filter of the F/P records, hand its listener to the host
 * over the F socket and close both, so that the command never holds the descriptor
 * that answers for it. For the learn mode's observer (enforce/observe.py) the host
 * answers every notification with CONTINUE: nothing is decided there, only seen. For
 * the connect guard (G=1, enforce/netguard.py) the host performs each connect() itself
 * and answers with its result. */
static void start_observer(const struct spec *s)
{
	const char *what = s->guard ? "the connect guard (Landlock ABI < 4)"
				    : "the learn mode's observer";
	struct sock_fprog prog;
	prog.len = (unsigned short)(s->observer_bpf_len / sizeof(struct sock_filter));
	struct sock_filter *insns = malloc(s->observer_bpf_len);
	if (!insns)
		die("loading the notification filter failed: ENOMEM; free memory");
	memcpy(insns, s->observer_bpf, s->observer_bpf_len);
	prog.filter = insns;
	int fd = -1;
	if (s->guard) {
		/* Once the host has received a connect, a signal must not interrupt and
		 * restart the call: the host may already have connected the socket, and the
		 * restarted call would then fail with EISCONN (Linux 5.19+; older kernels
		 * take the filter without it, at that cost). */
		fd = (int)syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER,
				  SECCOMP_FILTER_FLAG_NEW_LISTENER | SECCOMP_FILTER_FLAG_WAIT_KILLABLE_RECV,
				  &prog);
		if (fd < 0 && errno == EINVAL)
			debug("guard: no SECCOMP_FILTER_FLAG_WAIT_KILLABLE_RECV, loading without it");
	}
	if (fd < 0)
		fd = (int)syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER,
				  SECCOMP_FILTER_FLAG_NEW_LISTENER, &prog);
	free(insns);
	if (fd < 0 && errno == EBUSY)
		die("%s needs a seccomp listener of its own, and a parent already installed one (EBUSY: the kernel allows one per filter chain; a container runtime's seccomp notification, LXD's or sysbox's); run where Landlock has network rules (ABI 4, Linux 6.7) or user namespaces work",
		    what);
	if (fd < 0)
		die("%s needs seccomp user notification (Linux 5.5+): %s", what, errname(errno));
	char byte = 'L';
	struct iovec iov = {&byte, 1};
	union {
		struct cmsghdr h;
		char buf[CMSG_SPACE(sizeof(int))];
	} u;
	memset(&u, 0, sizeof u);
	struct msghdr msg;
	memset(&msg, 0, sizeof msg);
	msg.msg_iov = &iov;
	msg.msg_iovlen = 1;
	msg.msg_control = u.buf;
	msg.msg_controllen = sizeof u.buf;
	struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
	c->cmsg_level = SOL_SOCKET;
	c->cmsg_type = SCM_RIGHTS;
	c->cmsg_len = CMSG_LEN(sizeof(int));
	memcpy(CMSG_DATA(c), &fd, sizeof fd);
	if (sendmsg(s->observer_fd, &msg, 0) != 1)
		die("sending the listener of %s failed: %s", what, errname(errno));
	close(fd);
	close(s->observer_fd);
	debug("%s: listener handed to the host", what);
}

/* G=1: the guard is what confines connect() now; verify it answers before exec. A
 * connect to a loopback port that is not the proxy's must be refused with EACCES by the
 * host's supervisor (which answers EPERM when it cannot inspect the call, and nothing at
 * all, ENOSYS, once the listener is closed): without it the command must not run. */
static void verify_guard(void)
{
	int sk = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (sk < 0)
		die("verification failed: socket(AF_INET) gave %s; report a bug", errname(errno));
	struct sockaddr_in sa;
	memset(&sa, 0, sizeof sa);
	sa.sin_family = AF_INET;
	sa.sin_port = htons(1);
	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	if (connect(sk, (struct sockaddr *)&sa, sizeof sa) == 0 || errno != EACCES)
		die("verification failed: connect(127.0.0.1:1) was not refused by the connect guard (%s); it cannot confine the network here (stockade's message above says why)",
		    errname(errno));
	close(sk);
	debug("verified: the connect guard refused 127.0.0.1:1 with EACCES");
}

static void close_inherited_fds(void)
{
	/* A leaked fd (a host socket, a directory opened before Landlock) would carry
	 * rights past every layer; close them all.  close_range is Linux 5.9+.
	 *
	 * The upper bound is INT_MAX, not ~0U: no descriptor is above it (fs.nr_open is at
	 * most 2^31 - 64), and gVisor's Sentry refuses a bound above INT_MAX with EINVAL,
	 * where the loop below then made some 20000 close() calls, each a trip into the
	 * Sentry: about 50 ms of every gVisor run. */
	if (syscall(__NR_close_range, 3U, (unsigned int)INT_MAX, 0U) == 0) {
		debug("closed every descriptor above 2 with close_range");
		return;
	}
	debug("close_range refused (%s): closing descriptors one by one", errname(errno));
	long max = sysconf(_SC_OPEN_MAX);
	if (max < 0 || max > 1 << 20)
		max = 1 << 20;
	for (long fd = 3; fd < max; fd++)
		close((int)fd);
}

/* One mount of the spec: `kind` k (pin), b (protect), n (mask a file) or t (mask a
 * directory) at `path`. nosuid and nodev as bubblewrap's binds; the target follows
 * symlinks as bubblewrap's do (it mounts onto realpath(dest)). */
static void mount_one(char kind, const char *path)
{
	int fd;
	int readonly = kind != 'k';
	if (kind == 't') {
		int ctx = (int)syscall(__NR_fsopen, "tmpfs", MT_FSOPEN_CLOEXEC);
		if (ctx < 0)
			die("fsopen(tmpfs) to mask %s failed: %s; kernel older than 5.2?", path,
			    errname(errno));
		if (syscall(__NR_fsconfig, ctx, MT_FSCONFIG_SET_STRING, "mode", "0755", 0) != 0 ||
		    syscall(__NR_fsconfig, ctx, MT_FSCONFIG_CMD_CREATE, NULL, NULL, 0) != 0)
			die("fsconfig(tmpfs) to mask %s failed: %s", path, errname(errno));
		fd = (int)syscall(__NR_fsmount, ctx, MT_FSMOUNT_CLOEXEC, 0);
		close(ctx);
		if (fd < 0)
			die("fsmount(tmpfs) to mask %s failed: %s", path, errname(errno));
	} else {
		const char *source = kind == 'n' ? "/dev/null" : path;
		fd = (int)syscall(__NR_open_tree, AT_FDCWD, source,
				  MT_OPEN_TREE_CLONE | O_CLOEXEC | MT_AT_RECURSIVE);
		if (fd < 0)
			die("open_tree(%s) failed: %s; the path vanished, or the kernel is older than 5.2",
			    source, errname(errno));
	}
	struct mt_mount_attr attr = {
		.attr_set = MT_ATTR_NOSUID | MT_ATTR_NODEV | (readonly ? MT_ATTR_RDONLY : 0),
	};
	if (syscall(__NR_mount_setattr, fd, "", MT_AT_EMPTY_PATH | MT_AT_RECURSIVE, &attr,
		    sizeof attr) != 0)
		die("mount_setattr(%s) failed: %s; kernel older than 5.12?", path, errname(errno));
	if (syscall(__NR_move_mount, fd, "", AT_FDCWD, path,
		    MT_MOVE_MOUNT_F_EMPTY_PATH | MT_MOVE_MOUNT_T_SYMLINKS) != 0)
		die("move_mount(%s) failed: %s", path, errname(errno));
	close(fd);
	if (readonly) {
		/* Verify: the path now lies on a read-only mount. */
		struct statvfs st;
		if (statvfs(path, &st) != 0 || !(st.f_flag & ST_RDONLY))
			die("verification failed: %s is not read-only after mounting over it; report a kernel bug",
			    path);
	}
	debug("mounted %c over %s", kind, path);
}

/* The kernel's own words for a failed fsconfig/fsmount (the fs context's log), so a
 * refusal names its cause ("overlayfs: upper fs does not support xattr", ...). */
static const char *fc_log(int ctx, char *buf, size_t cap)
{
	size_t len = 0;
	buf[0] = '\0';
	for (;;) {
		ssize_t r = read(ctx, buf + len, cap - 1 - len);
		if (r <= 0 || len + (size_t)r + 2 >= cap)
			break;
		len += (size_t)r;
		buf[len++] = ';';
		buf[len] = '\0';
	}
	return len ? buf : "no message from the kernel";
}

#define OVERLAYFS_SUPER_MAGIC 0x794c7630

/* An overlay over `target` whose lower layer is `target` itself and whose upper and
 * work directories are `layer`/upper and `layer`/work (bound in by the runtime, then
 * masked). userxattr: in a user namespace overlayfs may only keep its metadata in
 * user.overlay.* xattrs (trusted.* needs CAP_SYS_ADMIN in the initial namespace).
 * Verified afterwards: overlayfs falls back to a read-only mount when it cannot make
 * its work directory, and a read-only workspace would break the run without a word. */
static void mount_overlay(const char *target, const char *layer)
{
	char upper[PATH_MAX], work[PATH_MAX], log[1024];
	if (snprintf(upper, sizeof upper, "%s/upper", layer) >= (int)sizeof upper ||
	    snprintf(work, sizeof work, "%s/work", layer) >= (int)sizeof work)
		die("overlay layer path %.200s is too long", layer);
	/* lowerdir+ (Linux 6.8+) takes one path as is. "lowerdir" splits its value at ':'
	 * (a workspace /w/a:b would be the two lower layers /w/a and b), and before 6.5
	 * every option is joined into one string split at ','. The release decides, not a
	 * failed try: before 6.5 any key is accepted until the create. */
	struct utsname un;
	int major = 0, minor = 0;
	if (uname(&un) == 0 && sscanf(un.release, "%d.%d", &major, &minor) != 2)
		major = minor = 0;
	int one_path = major > 6 || (major == 6 && minor >= 8);
	if (!one_path && (strpbrk(target, ",:\\") || strpbrk(layer, ",:\\")))
		die("overlay over %.200s refused: the workspace or layer path has ',', ':' or a backslash, which overlayfs before Linux 6.8 cannot take in a lower or upper directory; move it, or run without --overlay",
		    target);
	int ctx = (int)syscall(__NR_fsopen, "overlay", MT_FSOPEN_CLOEXEC);
	if (ctx < 0)
		die("fsopen(overlay) for the overlay workspace failed: %s; the kernel lacks overlayfs in user namespaces (Linux 5.11+, CONFIG_OVERLAY_FS), run without --overlay",
		    errname(errno));
	if (syscall(__NR_fsconfig, ctx, MT_FSCONFIG_SET_STRING, one_path ? "lowerdir+" : "lowerdir",
		    target, 0) != 0 ||
	    syscall(__NR_fsconfig, ctx, MT_FSCONFIG_SET_STRING, "upperdir", upper, 0) != 0 ||
	    syscall(__NR_fsconfig, ctx, MT_FSCONFIG_SET_STRING, "workdir", work, 0) != 0 ||
	    syscall(__NR_fsconfig, ctx, MT_FSCONFIG_SET_FLAG, "userxattr", NULL, 0) != 0 ||
	    syscall(__NR_fsconfig, ctx, MT_FSCONFIG_CMD_CREATE, NULL, NULL, 0) != 0) {
		int e = errno;
		die("overlay over %s refused by the kernel: %s (%s); the workspace must be a plain directory with no mount inside it, on a file system overlayfs accepts, and the state directory must support user xattrs",
		    target, errname(e), fc_log(ctx, log, sizeof log));
	}
	int fd = (int)syscall(__NR_fsmount, ctx, MT_FSMOUNT_CLOEXEC, 0);
	if (fd < 0) {
		int e = errno;
		die("fsmount(overlay) over %s failed: %s (%s)", target, errname(e),
		    fc_log(ctx, log, sizeof log));
	}
	close(ctx);
	struct mt_mount_attr attr = {.attr_set = MT_ATTR_NOSUID | MT_ATTR_NODEV};
	if (syscall(__NR_mount_setattr, fd, "", MT_AT_EMPTY_PATH, &attr, sizeof attr) != 0)
		die("mount_setattr(overlay over %s) failed: %s", target, errname(errno));
	if (syscall(__NR_move_mount, fd, "", AT_FDCWD, target, MT_MOVE_MOUNT_F_EMPTY_PATH) != 0)
		die("move_mount(overlay over %s) failed: %s", target, errname(errno));
	close(fd);
	struct statfs sf;
	struct statvfs sv;
	if (statfs(target, &sf) != 0 || (unsigned long)sf.f_type != OVERLAYFS_SUPER_MAGIC)
		die("verification failed: %s is not an overlay after mounting one over it; report a kernel bug",
		    target);
	if (statvfs(target, &sv) != 0 || (sv.f_flag & ST_RDONLY))
		die("overlay over %s came up read-only: overlayfs could not use the work directory %s (dmesg says why); check the state directory's file system",
		    target, work);
	debug("mounted an overlay over %s (layer %s)", target, layer);
}

static void drop_all_caps(void)
{
	for (int cap = 0; cap <= 63; cap++)
		if (prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0 && errno != EINVAL)
			die("prctl(PR_CAPBSET_DROP, %d) failed: %s", cap, errname(errno));
	if (prctl(PR_CAP_AMBIENT, 4 /* PR_CAP_AMBIENT_CLEAR_ALL */, 0, 0, 0) != 0 && errno != EINVAL)
		die("prctl(PR_CAP_AMBIENT_CLEAR_ALL) failed: %s", errname(errno));
	struct { uint32_t version; int pid; } hdr = {0x20080522 /* _LINUX_CAPABILITY_VERSION_3 */, 0};
	struct { uint32_t effective, permitted, inheritable; } data[2];
	memset(data, 0, sizeof data);
	if (syscall(SYS_capset, &hdr, data) != 0)
		die("capset(0) failed: %s", errname(errno));
}

/* SIGKILL every child of this process (each orphan of the tree is one: subreaper), reap
 * them, and again until none is left. A process being killed cannot fork any more, and
 * whatever it forked before dies reparented to us, so the loop ends. */
static void kill_children(void)
{
	char path[64];
	snprintf(path, sizeof path, "/proc/self/task/%d/children", (int)getpid());
	for (;;) {
		FILE *f = fopen(path, "re");
		if (f) {
			int pid;
			while (fscanf(f, "%d", &pid) == 1)
				kill(pid, SIGKILL);
			fclose(f);
		}
		pid_t got;
		errno = 0;
		while ((got = waitpid(-1, NULL, WNOHANG)) > 0)
			;
		if (got < 0 && errno == ECHILD)
			return;
		/* Some child is dying or was just reparented here: look again shortly. */
		usleep(500);
	}
}

/* The reaper's side of R=1: wait for the command, kill what it left, exit as it did. */
static void reap(pid_t child) __attribute__((noreturn));
static void reap(pid_t child)
{
	int status = 0;
	/* Signals meant for the run go to the command (stockade forwards them there); the
	 * reaper only outlives it long enough to clean up. */
	signal(SIGINT, SIG_IGN);
	signal(SIGQUIT, SIG_IGN);
	signal(SIGHUP, SIG_IGN);
	signal(SIGTSTP, SIG_IGN);
	signal(SIGTTOU, SIG_IGN);
	signal(SIGTTIN, SIG_IGN);
	close_inherited_fds();
	for (;;) {
		int st;
		pid_t got = waitpid(-1, &st, 0);
		if (got == child) {
			status = st;
			break;
		}
		if (got < 0 && errno != EINTR)
			break;
	}
	kill_children();
	if (WIFSIGNALED(status)) {
		/* Die of the same signal, so that the caller sees 128+N. */
		int sig = WTERMSIG(status);
		signal(sig, SIG_DFL);
		prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
		struct rlimit none = {0, 0};
		setrlimit(RLIMIT_CORE, &none);
		sigset_t all;
		sigfillset(&all);
		sigprocmask(SIG_UNBLOCK, &all, NULL);
		kill(getpid(), sig);
		_exit(128 + sig);
	}
	_exit(WIFEXITED(status) ? WEXITSTATUS(status) : EXIT_SETUP);
}

static int root_is_a_rule(const struct spec *s)
{
	size_t i;
	for (i = 0; i < s->n_read; i++)
		if (strcmp(s->read_paths[i], "/") == 0)
			return 1;
	for (i = 0; i < s->n_write; i++)
		if (strcmp(s->write_paths[i], "/") == 0)
			return 1;
	return 0;
}

int main(int argc, char **argv)
{
	struct spec s;
	char status[8192];
	char *end;
	size_t spec_len;

	if (argc < 4 || strcmp(argv[2], "--") != 0)
		die("usage: stockade-launcher SPEC_FD|/SPEC_PATH -- CMD [ARGS...]; it is started by stockade, not by hand");
	long spec_fd;
	if (argv[1][0] == '/') {
		/* gVisor's runsc passes no descriptor but stdio into the sandbox: there the
		 * spec is a file the runtime put in the bundle's read-only rootfs. */
		spec_fd = open(argv[1], O_RDONLY | O_CLOEXEC);
		if (spec_fd < 0)
			die("open(%s) for the spec failed: %s", argv[1], errname(errno));
	} else {
		errno = 0;
		spec_fd = strtol(argv[1], &end, 10);
		if (errno || *end || spec_fd < 3 || spec_fd > 1 << 20)
			die("bad SPEC_FD %.20s: must be an inherited fd number above 2", argv[1]);
	}

	char *buf = read_spec((int)spec_fd, &spec_len);
	close((int)spec_fd);
	parse_spec(buf, spec_len, &s);
	g_debug = s.debug;

	/* Held until the runtime has put this process in the run's cgroup (no bubblewrap
	 * --block-fd without namespaces): everything it starts is then born inside. */
	if (s.hold_fd) {
		char go;
		ssize_t r;
		do
			r = read(s.hold_fd, &go, 1);
		while (r < 0 && errno == EINTR);
		if (r != 1)
			die("the runtime did not release the command (hold fd %d: %s); it did not run",
			    s.hold_fd, r < 0 ? errname(errno) : "EOF");
		close(s.hold_fd);
	}

	/* Opened before Landlock so that verification works whether or not /proc is an
	 * allowed path; the fd is closed with the others before exec. */
	int status_fd = open("/proc/self/status", O_RDONLY | O_CLOEXEC);
	if (status_fd < 0)
		die("open(/proc/self/status) failed: %s; mount a fresh /proc (bwrap --proc /proc)",
		    errname(errno));

	/* (0) The mounts, with the CAP_SYS_ADMIN bubblewrap left for this alone.
	 * bubblewrap's --disable-userns put this process in a user namespace nested in the
	 * one that owns the sandbox's mount namespace, so the binds go into a mount
	 * namespace of its own (owned by this user namespace; every earlier mount stays
	 * locked in place). The only process left in the old one is bubblewrap's init
	 * (pid 1), whose /proc/1/root shows the paths without these mounts: the runtime
	 * asks for launcher binds only with Landlock on, which denies a sandboxed process
	 * any ptrace access (and so /proc/PID/root) to a process outside its domain. */
	if (s.n_binds) {
		if (!s.landlock)
			die("bad spec: mounts made by the launcher need Landlock (L=1); rebuild the spec");
		if (unshare(CLONE_NEWNS) != 0)
			die("unshare(CLONE_NEWNS) for the launcher's mounts failed: %s", errname(errno));
		for (size_t i = 0; i < s.n_binds; i++) {
			if (s.binds[i].kind == 'o')
				mount_overlay(s.binds[i].path, s.binds[i].layer);
			else
				mount_one(s.binds[i].kind, s.binds[i].path);
		}
		/* The working directory bubblewrap chose was resolved before these mounts: one
		 * inside a protected directory would still be the writable one below the new
		 * mount. Resolve it again, through them. */
		char cwd[PATH_MAX];
		if (getcwd(cwd, sizeof cwd) == NULL)
			die("getcwd() after the launcher's mounts failed: %s", errname(errno));
		if (chdir(cwd) != 0)
			die("chdir(%s) after the launcher's mounts failed: %s", cwd, errname(errno));
	}

	/* Without bubblewrap (container layer off) a caller running as root still holds
	 * every capability, and after binding this process still holds CAP_SYS_ADMIN: give
	 * them all up, for good, before checking that none is left. */
	if (s.drop_caps || s.n_binds)
		drop_all_caps();

	/* (a) A capability left over (root without --cap-drop ALL, a file cap, an ambient
	 * set) would let the command undo every layer below, e.g. by mounting over paths. */
	read_status(status_fd, status, sizeof status);
	unsigned long long eff = status_hex(status, "CapEff");
	unsigned long long prm = status_hex(status, "CapPrm");
	/* gVisor's /proc/self/status has no CapAmb line. The ambient set is a subset of
	 * the permitted one, so with CapPrm checked as 0 a missing line cannot hide one. */
	unsigned long long amb = status_field(status, "CapAmb") ? status_hex(status, "CapAmb") : 0;
	if (eff || prm || amb)
		die("capabilities remain (CapEff=%llx CapPrm=%llx CapAmb=%llx); run bwrap with --cap-drop ALL or as an unprivileged user",
		    eff, prm, amb);
	/* After its own mounts the launcher emptied the bounding set as well (bubblewrap's
	 * --cap-drop ALL does so otherwise): check that too. */
	if (s.n_binds && status_hex(status, "CapBnd"))
		die("capabilities remain in the bounding set (CapBnd=%llx) after the launcher's mounts; run bwrap with --cap-add CAP_SETPCAP",
		    status_hex(status, "CapBnd"));

	/* Limits before anything else runs in this process tree: rlimits are inherited by
	 * every child, and an unprivileged process can lower but never raise them again. */
	for (size_t i = 0; i < s.n_rlimits; i++) {
		struct rlimit rl = {s.rlimits[i].value, s.rlimits[i].value}, got;
		if (setrlimit(s.rlimits[i].resource, &rl) != 0)
			die("setrlimit(%d, %llu) failed: %s; lower the limit in [limits] or run with --disable limits",
			    s.rlimits[i].resource, (unsigned long long)s.rlimits[i].value, errname(errno));
		if (getrlimit(s.rlimits[i].resource, &got) != 0 || got.rlim_cur != rl.rlim_cur)
			die("verification failed: rlimit %d is not %llu after setrlimit; report a kernel bug",
			    s.rlimits[i].resource, (unsigned long long)rl.rlim_cur);
	}

	/* A pty of its own as controlling terminal (interactive runs): job control works,
	 * and the terminal that TIOCSTI could reach is the sandbox's own. bwrap may have
	 * made us a session leader already (--new-session), so EPERM from setsid is fine. */
	if (s.ctty) {
		if (setsid() < 0 && errno != EPERM)
			die("setsid() failed: %s", errname(errno));
		if (ioctl(0, TIOCSCTTY, 0) != 0)
			die("ioctl(TIOCSCTTY) on stdin failed: %s; stdin must be the sandbox's pty",
			    errname(errno));
	}

	/* (b) no_new_privs: setuid/setgid bits and file caps stop granting privilege on
	 * exec, and it is the precondition for unprivileged Landlock and seccomp. */
	if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0)
		die("prctl(PR_SET_NO_NEW_PRIVS) failed: %s; kernel older than 3.5?", errname(errno));

	/* Without a PID namespace nothing ends what the command leaves running: the
	 * launcher stays its parent, as a subreaper every orphan of the tree comes back to,
	 * and kills them all once the command is gone. Forked before any restriction so
	 * that it can signal the whole tree; it runs nothing but this file's code. */
	if (s.reaper) {
		if (prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0)
			die("prctl(PR_SET_CHILD_SUBREAPER) failed: %s; kernel older than 3.4?", errname(errno));
		pid_t parent = getpid();
		pid_t child = fork();
		if (child < 0)
			die("fork() for the reaper failed: %s; raise the process limit", errname(errno));
		if (child > 0)
			reap(child);
		/* The command dies with the reaper (stockade killing it on timeout). */
		if (prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0) != 0 || getppid() != parent)
			die("prctl(PR_SET_PDEATHSIG) failed or the reaper is gone; the command did not run");
		/* The status fd names the reaper's /proc entry: open the child's own. */
		close(status_fd);
		status_fd = open("/proc/self/status", O_RDONLY | O_CLOEXEC);
		if (status_fd < 0)
			die("open(/proc/self/status) failed: %s", errname(errno));
	}

	/* (c) Landlock after bwrap's mounts (a Landlock domain may not change mount
	 * topology) and on inodes, so no later mount trick or link can route around it. */
	if (s.landlock)
		apply_landlock(&s);

	/* (d) seccomp last among the restrictions, so the filter need not allow the
	 * Landlock syscalls; only read/open/close_range/execve follow it. */
	if (s.bpf)
		load_seccomp(&s);

	/* (e) Verify the effects instead of trusting return codes. */
	read_status(status_fd, status, sizeof status);
	/* gVisor's /proc/self/status has no NoNewPrivs line: ask the kernel (the Sentry)
	 * then. The host kernel always has the line, so there nothing changes. */
	if (status_field(status, "NoNewPrivs") ? status_long(status, "NoNewPrivs") != 1
					       : prctl(PR_GET_NO_NEW_PRIVS, 0, 0, 0, 0) != 1)
		die("verification failed: NoNewPrivs is not 1 after prctl; report a kernel bug");
	if (s.seccomp_expected && status_long(status, "Seccomp") != SECCOMP_MODE_FILTER)
		die("verification failed: Seccomp is not 2 (filter) although a filter was asked for; pass --seccomp FD to bwrap or a program in the spec");
	if (s.landlock && !s.deny_probe && !root_is_a_rule(&s))
		/* No probe given: "/" itself always exists and is outside every rule unless
		 * a rule names it, so READ_DIR on it must now be refused. */
		s.deny_probe = "/";
	if (s.landlock && s.deny_probe) {
		/* O_NONBLOCK|O_NOCTTY: a FIFO or a tty as probe must not hang or attach. */
		int fd = open(s.deny_probe, O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
		if (fd >= 0)
			die("verification failed: %s is readable under Landlock; the ruleset did not take effect, use --disable files only if you accept that",
			    s.deny_probe);
		if (errno != EACCES)
			die("verification failed: open(%s) gave %s, not EACCES; choose a must-deny probe that exists outside every allowed path",
			    s.deny_probe, errname(errno));
		debug("verified: %s denied with EACCES", s.deny_probe);
	}
	if (s.landlock && s.handle_net) {
		/* A TCP connect to a loopback port outside the rules must now be refused by
		 * Landlock (EACCES) before any packet is sent; without the rule it would get
		 * ECONNREFUSED (or a connection). */
		uint16_t probe = 1;
		for (size_t i = 0; i < s.n_connect; i++)
			if (s.connect_ports[i] == probe)
				probe = 2;
		int sk = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
		if (sk < 0)
			die("verification failed: socket(AF_INET) gave %s; report a bug", errname(errno));
		struct sockaddr_in sa;
		memset(&sa, 0, sizeof sa);
		sa.sin_family = AF_INET;
		sa.sin_port = htons(probe);
		sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
		if (connect(sk, (struct sockaddr *)&sa, sizeof sa) == 0 || errno != EACCES)
			die("verification failed: connect(127.0.0.1:%u) was not refused by Landlock (%s); the network rules did not take effect",
			    probe, errname(errno));
		close(sk);
		debug("verified: connect to 127.0.0.1:%u denied with EACCES", probe);
	}
	close(status_fd);

	/* The learn mode's observer (or the connect guard) last, after the verification, so
	 * that it sees the command's calls and none of the launcher's probes; stockade's
	 * filter is already loaded (its ERRNO outranks USER_NOTIF whatever the order,
	 * enforce/observe.py). The guard then verifies itself. */
	if (s.guard && !(s.observer_bpf && s.observer_fd))
		die("bad spec: the connect guard (G=1) needs its F and P records; rebuild the spec");
	if (s.observer_bpf && s.observer_fd)
		start_observer(&s);
	if (s.guard)
		verify_guard();

	/* (f) */
	close_inherited_fds();

	/* (g) With X=1 the environment is the spec's (its strings live in buf, which is
	 * therefore kept): execvp searches the command's PATH, as bwrap's exec does. */
	if (s.own_env) {
		static char *empty[] = {NULL};
		environ = s.envp ? s.envp : empty;
	} else {
		free(buf);
	}
	execvp(argv[3], &argv[3]);
	int e = errno;
	dprintf(2, "stockade: cannot run %s: %s\n", argv[3], strerror(e));
	return e == ENOENT ? EXIT_NOTFOUND : EXIT_NOEXEC;
}
