/*
 * stockade's gVisor entry: a user and network namespace of stockade's own, then runsc
 * (enforce/gvisor.py's entry_argv builds the argv; runtime/_gvisor.py runs it).
 *
 *   gvisor-entry UID GID PPID INFO_FD BLOCK_FD NET ROOT ID OVERLAY LAYER REFUSED BINDS -- RUNSC...
 *
 *   UID, GID   the caller's ids, mapped to 0 in the new user namespace
 *   PPID       the spawner: the entry gives up when its parent is another process
 *   INFO_FD    where it writes {"child-pid": N}, then closes it
 *   BLOCK_FD   where it reads the one byte '1' that lets it go on, then closes it
 *   NET        1: a network namespace too (the egress layer's); 0: the caller's network
 *   ROOT       runsc's state directory, as "--root=..." (how a signal is forwarded)
 *   ID         the container's id in it
 *   OVERLAY    the workspace of an overlay run, else empty
 *   LAYER      the layer directory holding upper/ and work/, else empty
 *   REFUSED    the file where the entry says why the kernel refused the overlay
 *   BINDS      a file of binds to repeat on the host side (see below), else empty
 *   RUNSC...   runsc's argv (``runsc ... run ...``), exec'd as the entry's child
 *
 * It speaks bubblewrap's --info-fd/--block-fd protocol, so the runtime's start handshake
 * (cgroup, proxy listener, capture) is the same for both backends. NET 1 makes the
 * network namespace (the egress layer's); 0 keeps the caller's (egress off: runsc
 * --network=host then is the host's network, as bubblewrap's --share-net is).
 *
 * An overlay workspace (OVERLAY the workspace, LAYER the layer directory holding upper/
 * and work/; both empty otherwise): the entry makes a mount namespace too (owned by its
 * user namespace, so nothing it mounts propagates to the host) and mounts overlayfs over
 * the workspace path itself, the workspace its lower layer, with userxattr: the layer
 * has the format the launcher's overlay gives under bubblewrap (stockade.workspace reads
 * both). runsc, started in that namespace, binds the merged view: in it no path leads to
 * the real workspace, and every bind below it (protected paths) is of the merged view.
 * The layer directory is then covered with an empty read-only tmpfs, so no bind of a
 * parent can show the upper to the sandbox. gVisor's own overlays cannot do this
 * (docs/gvisor.md). The mount is made after the block fd lets the entry go; when the
 * kernel refuses it, the entry writes why to REFUSED (a host file in the run's private
 * scratch) and exits 125 before runsc starts: the runtime raises that as Unavailable,
 * never runs a read-write workspace instead.
 *
 * BINDS (enforce/gvisor.py's host_binds): NUL-terminated records, "r/path" or "w/path",
 * in the bundle's order. With them the entry makes a mount namespace of its own (as for
 * an overlay) and, after the overlay if any, binds each "r" path onto itself read-only,
 * recursively (open_tree, mount_setattr, move_mount: Linux 5.12), and makes each "w"
 * path that now lies on a read-only mount read-write again the same way. runsc, started
 * in that namespace, then runs with directfs (the Sentry opens host files itself): runsc
 * 20240729 truncates a host file opened with O_TRUNC below a read-only bind before it
 * answers EROFS, and here the host kernel refuses that open first. A record it cannot
 * apply ends the entry (125, the path named) before runsc starts: never a sandbox whose
 * read-only binds are writable on the host.
 *
 * It stays as `runsc run`'s parent rather than exec it: `runsc run` forwards no signal to
 * the container (release 20240729; `runsc do` does), and a SIGTERM the runtime forwarded
 * to it killed runsc, and the sandbox with it, before the command's handler ran (a
 * `trap ... TERM` never ran; the run ended 143). The entry hands SIGINT, SIGTERM and
 * SIGHUP to the container's init, the command, with `runsc --root=ROOT kill ID SIG`
 * (about 20 ms); when that fails (no container yet, or gone) it signals runsc itself.
 * Its exit status is runsc's, a death by a signal passed on as the same death.
 *
 * Why C: it runs on every gVisor run before runsc starts. It was a Python script
 * (python3 -I -S -c), whose interpreter cost about 10 ms of that start-up and about
 * 10 MB per sandbox; this program does nothing but system calls. Only libc and kernel
 * ABI constants are used (the new mount API's are written out: old headers lack them).
 *
 * Descriptors: it keeps 0, 1, 2, INFO_FD and BLOCK_FD, and closes every other one it
 * inherited before anything else (a descriptor that was not close-on-exec in a threaded
 * spawner must not ride into runsc's namespaces); runsc gets 0, 1 and 2 alone. Every
 * descriptor it opens itself is close-on-exec.
 *
 * Exit status: runsc's, or 125 when the entry fails itself: a parent that is not PPID
 * (nobody would release it), a block fd that is closed without '1' (the runtime gave
 * up), a refused overlay (the reason in REFUSED), or a failed step, which it names on
 * stderr as "stockade: gvisor entry: <step> failed: <reason>".
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <net/if.h>
#include <signal.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <unistd.h>

#define EXIT_ENTRY 125

/* ---- kernel ABI, written out on purpose: old headers lack the new mount API ---- */
#ifndef CLONE_NEWUSER
#define CLONE_NEWUSER 0x10000000
#endif
#ifndef CLONE_NEWNS
#define CLONE_NEWNS 0x00020000
#endif
#ifndef CLONE_NEWNET
#define CLONE_NEWNET 0x40000000
#endif
/* fsopen, fsconfig, fsmount, move_mount (Linux 5.2+): the same numbers on every
 * architecture runsc runs on. */
#ifndef __NR_move_mount
#define __NR_move_mount 429
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
#ifndef __NR_close_range
#define __NR_close_range 436
#endif
#define EN_FSOPEN_CLOEXEC 0x00000001
#define EN_FSCONFIG_SET_FLAG 0
#define EN_FSCONFIG_SET_STRING 1
#define EN_FSCONFIG_CMD_CREATE 6
#define EN_FSMOUNT_CLOEXEC 0x00000001
#define EN_MOUNT_ATTR_NOSUID 0x00000002
#define EN_MOUNT_ATTR_NODEV 0x00000004
#define EN_MOVE_MOUNT_F_EMPTY_PATH 0x00000004
#define EN_AT_FDCWD (-100)
/* open_tree, mount_setattr (Linux 5.2, 5.12): the same numbers everywhere. */
#ifndef __NR_open_tree
#define __NR_open_tree 428
#endif
#ifndef __NR_mount_setattr
#define __NR_mount_setattr 442
#endif
#define EN_OPEN_TREE_CLONE 1
#define EN_OPEN_TREE_CLOEXEC O_CLOEXEC
#define EN_AT_RECURSIVE 0x8000
#define EN_AT_EMPTY_PATH 0x1000
#define EN_MOUNT_ATTR_RDONLY 0x00000001
struct en_mount_attr {
	unsigned long long attr_set, attr_clr, propagation, userns_fd;
};
#define OVERLAYFS_SUPER_MAGIC 0x794c7630UL

static const char *refused_path;

/* Name the step that failed, with errno's reason, and end: before runsc starts, or, for
 * a failure while waiting for it, taking runsc along (its parent-death signal). */
static void die(const char *what)
{
	int e = errno;
	char msg[1024];
	int n = snprintf(msg, sizeof msg, "stockade: gvisor entry: %s failed: %s\n", what,
			 e ? strerror(e) : "");
	if (n > 0)
		(void)!write(2, msg, (size_t)n < sizeof msg ? (size_t)n : sizeof msg - 1);
	_exit(EXIT_ENTRY);
}

static void write_all(int fd, const char *text, size_t len)
{
	while (len > 0) {
		ssize_t w = write(fd, text, len);
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			return;
		text += w;
		len -= (size_t)w;
	}
}

/* The kernel refused the overlay workspace: say why in REFUSED (the runtime raises it as
 * Unavailable, naming the reason) and end before runsc starts. */
__attribute__((format(printf, 1, 2))) static void refuse(const char *fmt, ...)
{
	char why[4096];
	va_list ap;
	va_start(ap, fmt);
	int n = vsnprintf(why, sizeof why, fmt, ap);
	va_end(ap);
	size_t len = n < 0 ? 0 : (size_t)n < sizeof why ? (size_t)n : sizeof why - 1;
	int fd = open(refused_path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
	if (fd >= 0) {
		write_all(fd, why, len);
		close(fd);
	} else {
		/* No file to say it in (it cannot be there already: the run's scratch is
		 * private and fresh): stderr at least, still before runsc starts. */
		write_all(2, "stockade: gvisor entry: ", 24);
		write_all(2, why, len);
		write_all(2, "\n", 1);
	}
	_exit(EXIT_ENTRY);
}

static long number(const char *text, long lo, long hi)
{
	char *end;
	errno = 0;
	long v = strtol(text, &end, 10);
	if (errno || *text == '\0' || *end != '\0' || v < lo || v > hi) {
		errno = EINVAL;
		die("reading the arguments");
	}
	return v;
}

/* close(2) every descriptor from `first` to `last`: close_range, or before Linux 5.9 one
 * at a time up to the descriptor limit. */
static void close_span(unsigned first, unsigned last)
{
	if (syscall(__NR_close_range, first, last, 0) == 0)
		return;
	struct rlimit rl;
	unsigned top = getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < 65536
			       ? (unsigned)rl.rlim_cur
			       : 65536;
	for (unsigned fd = first; fd <= last && fd < top; fd++)
		close((int)fd);
}

/* Close every inherited descriptor above 2 but the two of the handshake. */
static void close_inherited(int a, int b)
{
	unsigned keep[2] = {(unsigned)(a < b ? a : b), (unsigned)(a < b ? b : a)};
	unsigned next = 3;
	for (int i = 0; i < 2; i++) {
		if (keep[i] < next)
			continue; /* one of 0, 1, 2, or the same descriptor twice */
		if (keep[i] > next)
			close_span(next, keep[i] - 1);
		next = keep[i] + 1;
	}
	close_span(next, ~0U);
}

static void write_proc(const char *name, const char *text)
{
	char path[64], what[96];
	snprintf(path, sizeof path, "/proc/self/%s", name);
	snprintf(what, sizeof what, "writing %s", path);
	int fd = open(path, O_WRONLY | O_CLOEXEC);
	if (fd < 0)
		die(what);
	size_t len = strlen(text);
	if (write(fd, text, len) != (ssize_t)len)
		die(what);
	close(fd);
}

/* Bring lo up in the new network namespace: the proxy's listener and the resolver are
 * put on 127.0.0.1 there (egress/_netns.py waits for it). */
static void loopback_up(void)
{
	int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	if (s < 0)
		die("socket(AF_INET)");
	struct ifreq req;
	memset(&req, 0, sizeof req);
	strncpy(req.ifr_name, "lo", IFNAMSIZ - 1);
	if (ioctl(s, SIOCGIFFLAGS, &req) < 0)
		die("ioctl(SIOCGIFFLAGS, lo)");
	req.ifr_flags |= IFF_UP;
	if (ioctl(s, SIOCSIFFLAGS, &req) < 0)
		die("ioctl(SIOCSIFFLAGS, lo)");
	close(s);
}

/* The kernel's own words for a refused fsconfig ("overlayfs: ..."): each message the fs
 * context holds, stripped, joined with "; ". */
static const char *fs_log(int ctx, char *buf, size_t cap)
{
	size_t len = 0;
	int count = 0;
	buf[0] = '\0';
	for (;;) {
		char line[513];
		ssize_t r = read(ctx, line, sizeof line - 1);
		if (r <= 0)
			break;
		line[r] = '\0';
		char *start = line, *end = line + r;
		while (start < end && (*start == ' ' || (*start >= '\t' && *start <= '\r')))
			start++;
		while (end > start && (end[-1] == ' ' || (end[-1] >= '\t' && end[-1] <= '\r')))
			end--;
		*end = '\0';
		int n = snprintf(buf + len, cap - len, "%s%s", count++ ? "; " : "", start);
		if (n < 0 || (size_t)n >= cap - len) {
			len = cap - 1;
			break;
		}
		len += (size_t)n;
	}
	return len ? buf : "no message from the kernel";
}

/* statfs's f_type, or -1 when the path cannot be asked. */
static long fs_type(const char *path)
{
	struct statfs sf;
	return statfs(path, &sf) == 0 ? (long)sf.f_type : -1;
}

static char *joined(const char *dir, const char *name)
{
	size_t a = strlen(dir), b = strlen(name);
	char *out = malloc(a + b + 2);
	if (out == NULL)
		die("malloc");
	memcpy(out, dir, a);
	out[a] = '/';
	memcpy(out + a + 1, name, b + 1);
	return out;
}

/* The leading digits of a release's part ("18-generic" -> 18), 0 when there are none. */
static int lead(const char *part)
{
	int v = 0;
	while (*part >= '0' && *part <= '9' && v < 100000)
		v = v * 10 + (*part++ - '0');
	return v;
}

static int ctx = -1;
static char log_buf[2048];

/* One fsconfig call per option, so no path is parsed out of an option string. */
static void config(const char *key, const char *value)
{
	if (syscall(__NR_fsconfig, ctx, value ? EN_FSCONFIG_SET_STRING : EN_FSCONFIG_SET_FLAG, key,
		    value, 0) != 0) {
		int e = errno;
		refuse("overlayfs refused %s=%s: %s (%s)", key, value ? value : "", strerror(e),
		       fs_log(ctx, log_buf, sizeof log_buf));
	}
}

static void overlay(const char *ovl, const char *layer)
{
	ctx = (int)syscall(__NR_fsopen, "overlay", EN_FSOPEN_CLOEXEC);
	if (ctx < 0)
		refuse("fsopen(overlay): %s (the kernel lacks overlayfs in user namespaces: Linux 5.11+, CONFIG_OVERLAY_FS)",
		       strerror(errno));
	/* lowerdir+ (Linux 6.8+) takes one path as is. Before, "lowerdir" splits its value
	 * at ':', and before 6.5 every option is joined into one string split at ','. The
	 * release decides, not a failed try: before 6.5 any key is accepted until the end. */
	struct utsname un;
	if (uname(&un) != 0)
		die("uname");
	int major = lead(un.release), minor = -1; /* a release without ".minor" is below x.0 */
	const char *dot = strchr(un.release, '.');
	if (dot != NULL)
		minor = lead(dot + 1);
	if (major > 6 || (major == 6 && minor >= 8)) {
		config("lowerdir+", ovl);
	} else {
		if (strpbrk(ovl, ",:\\") || strpbrk(layer, ",:\\"))
			refuse("the workspace or layer path has ',', ':' or a backslash, which overlayfs before Linux 6.8 cannot take in a lower or upper directory");
		config("lowerdir", ovl);
	}
	char *upper = joined(layer, "upper"), *work = joined(layer, "work");
	config("upperdir", upper);
	config("workdir", work);
	/* In a user namespace overlayfs keeps whiteouts' and opaque directories' marks in
	 * user.overlay.* xattrs (trusted.* needs the initial namespace's CAP_SYS_ADMIN). */
	config("userxattr", NULL);
	if (syscall(__NR_fsconfig, ctx, EN_FSCONFIG_CMD_CREATE, NULL, NULL, 0) != 0) {
		int e = errno;
		char why[2400];
		snprintf(why, sizeof why, "%s%s", fs_log(ctx, log_buf, sizeof log_buf),
			 (unsigned long)fs_type(ovl) == OVERLAYFS_SUPER_MAGIC
				 /* overlayfs says this one only in dmesg: name it, it is the likely
				  * case (a workspace in a container whose own root is an overlay of
				  * an overlay). */
				 ? "; the workspace itself lies on overlayfs, and the kernel stacks file systems at most 2 deep (dmesg: maximum fs stacking depth exceeded)"
				 : "");
		refuse("overlayfs over %s: %s (%s); the workspace must be a directory overlayfs accepts as a lower layer and the state directory's file system must support user xattrs",
		       ovl, strerror(e), why);
	}
	/* nosuid, nodev: nothing the run writes is a setuid program or a device to anyone. */
	int mnt = (int)syscall(__NR_fsmount, ctx, EN_FSMOUNT_CLOEXEC,
			       EN_MOUNT_ATTR_NOSUID | EN_MOUNT_ATTR_NODEV);
	if (mnt < 0) {
		int e = errno;
		refuse("fsmount(overlay): %s (%s)", strerror(e), fs_log(ctx, log_buf, sizeof log_buf));
	}
	if (syscall(__NR_move_mount, mnt, "", EN_AT_FDCWD, ovl, EN_MOVE_MOUNT_F_EMPTY_PATH) != 0)
		refuse("move_mount(overlay over %s): %s", ovl, strerror(errno));
	close(mnt);
	close(ctx);
	ctx = -1;
	free(upper);
	free(work);
	/* Verified: overlayfs comes up read-only when it cannot use its work directory, and
	 * a workspace that refuses every write would break the run without a word. */
	if ((unsigned long)fs_type(ovl) != OVERLAYFS_SUPER_MAGIC)
		refuse("verification: %s is not an overlay after mounting one over it", ovl);
	struct statvfs sv;
	if (statvfs(ovl, &sv) != 0)
		refuse("verification: statvfs(%s): %s", ovl, strerror(errno));
	if (sv.f_flag & ST_RDONLY)
		refuse("overlayfs over %s came up read-only: it could not use the work directory %s/work (dmesg says why)",
		       ovl, layer);
	/* The layer out of every view runsc builds: an empty read-only tmpfs over it. The
	 * overlay holds its upper and work directories already. */
	if (mount("tmpfs", layer, "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC,
		  "mode=0") != 0)
		refuse("mounting an empty tmpfs over the layer %s: %s", layer, strerror(errno));
	/* The entry's working directory is the real workspace, below the new mount: runsc
	 * would start in it. */
	if (chdir("/") != 0)
		die("chdir(/)");
}

/* Bind `path` onto itself with MOUNT_ATTR_RDONLY set (`ro`) or cleared, recursively;
 * 0, or -1 with errno (what failed in `step`). */
static int rebind(const char *path, int ro, const char **step)
{
	*step = "open_tree";
	int fd = (int)syscall(__NR_open_tree, EN_AT_FDCWD, path,
			      EN_OPEN_TREE_CLONE | EN_OPEN_TREE_CLOEXEC | EN_AT_RECURSIVE);
	if (fd < 0)
		return -1;
	struct en_mount_attr attr;
	memset(&attr, 0, sizeof attr);
	if (ro)
		attr.attr_set = EN_MOUNT_ATTR_RDONLY;
	else
		attr.attr_clr = EN_MOUNT_ATTR_RDONLY;
	*step = "mount_setattr";
	if (syscall(__NR_mount_setattr, fd, "", EN_AT_EMPTY_PATH | EN_AT_RECURSIVE, &attr,
		    sizeof attr) != 0) {
		int e = errno;
		close(fd);
		errno = e;
		return -1;
	}
	*step = "move_mount";
	if (syscall(__NR_move_mount, fd, "", EN_AT_FDCWD, path, EN_MOVE_MOUNT_F_EMPTY_PATH) != 0) {
		int e = errno;
		close(fd);
		errno = e;
		return -1;
	}
	close(fd);
	return 0;
}

/* Apply BINDS (the header says why). The file is the run's own, in its private scratch,
 * written before the entry was spawned. */
static void host_binds(const char *file)
{
	int fd = open(file, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		die("opening the binds file");
	struct stat st;
	if (fstat(fd, &st) != 0)
		die("reading the binds file");
	if (st.st_size <= 0 || st.st_size > (1 << 24)) {
		errno = EINVAL;
		die("reading the binds file");
	}
	size_t size = (size_t)st.st_size;
	char *buf = malloc(size + 1);
	if (buf == NULL)
		die("malloc");
	size_t got = 0;
	while (got < size) {
		ssize_t r = read(fd, buf + got, size - got);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0) {
			errno = r == 0 ? EINVAL : errno;
			die("reading the binds file");
		}
		got += (size_t)r;
	}
	close(fd);
	buf[size] = '\0';
	if (buf[size - 1] != '\0') {
		errno = EINVAL;
		die("reading the binds file (a record without its end)");
	}
	for (char *rec = buf; rec < buf + size; rec += strlen(rec) + 1) {
		char kind = rec[0];
		const char *path = rec + 1;
		if ((kind != 'r' && kind != 'w') || path[0] != '/') {
			errno = EINVAL;
			die("reading the binds file (a record that is not r/path or w/path)");
		}
		const char *step;
		char what[4200];
		if (kind == 'w') {
			/* Read-write: only where a read-only bind above made it read-only; a path
			 * the host itself holds read-only (locked) stays so, as runsc's bind of it
			 * would. */
			struct statvfs sv;
			if (statvfs(path, &sv) != 0) {
				snprintf(what, sizeof what, "statvfs(%s)", path);
				die(what);
			}
			if (!(sv.f_flag & ST_RDONLY))
				continue;
			if (rebind(path, 0, &step) == 0)
				continue;
			if (errno == EPERM)
				continue;
		} else if (rebind(path, 1, &step) == 0) {
			/* Verified, as the launcher verifies its binds: the path now lies on a
			 * read-only mount, or runsc does not start. */
			struct statvfs sv;
			if (statvfs(path, &sv) == 0 && (sv.f_flag & ST_RDONLY))
				continue;
			step = "verification (still writable after the bind)";
			errno = 0;
		}
		snprintf(what, sizeof what, "%s of %s, bound %s on the host side", step, path,
			 kind == 'r' ? "read-only" : "read-write");
		die(what);
	}
	free(buf);
	/* The entry's working directory may lie below one of the new mounts: runsc would
	 * start in the old one. */
	if (chdir("/") != 0)
		die("chdir(/)");
}

static char **runsc;
static const char *root, *cid;
static pid_t runsc_pid;
static sigset_t original_mask;

/* Hand `sig` to the container's init (the command) with `runsc --root=ROOT kill ID SIG`;
 * when that fails (no container yet, or gone), signal runsc itself. */
static void forward(int sig)
{
	char number_text[16];
	snprintf(number_text, sizeof number_text, "%d", sig);
	char *argv[] = {runsc[0], (char *)root, "kill", (char *)cid, number_text, NULL};
	posix_spawnattr_t attr;
	int ok = 0;
	if (posix_spawnattr_init(&attr) == 0) {
		/* runsc kill starts with the signal mask the entry was given, not the one it
		 * waits with. */
		pid_t killer;
		if (posix_spawnattr_setsigmask(&attr, &original_mask) == 0 &&
		    posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK) == 0 &&
		    posix_spawn(&killer, runsc[0], NULL, &attr, argv, environ) == 0) {
			int status;
			pid_t r;
			while ((r = waitpid(killer, &status, 0)) < 0 && errno == EINTR)
				;
			ok = r == killer && WIFEXITED(status) && WEXITSTATUS(status) == 0;
		}
		posix_spawnattr_destroy(&attr);
	}
	if (!ok)
		(void)kill(runsc_pid, sig); /* ESRCH: runsc is gone, its status says the rest */
}

int main(int argc, char **argv)
{
	if (argc < 15 || strcmp(argv[13], "--") != 0) {
		errno = EINVAL;
		die("reading the arguments");
	}
	uid_t uid = (uid_t)number(argv[1], 0, 0xfffffffeL);
	gid_t gid = (gid_t)number(argv[2], 0, 0xfffffffeL);
	pid_t ppid = (pid_t)number(argv[3], 1, 0x7fffffffL);
	int info = (int)number(argv[4], 0, 0x7fffffffL);
	int block = (int)number(argv[5], 0, 0x7fffffffL);
	int net = (int)number(argv[6], 0, 1);
	root = argv[7];
	cid = argv[8];
	const char *ovl = argv[9], *layer = argv[10];
	refused_path = argv[11];
	const char *binds = argv[12];
	runsc = argv + 14;

	close_inherited(info, block);
	/* Die with stockade (SIGKILL); runsc, forked below, dies with the entry in turn. A
	 * parent already gone means nobody will release us. */
	if (prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0) != 0)
		die("prctl(PR_SET_PDEATHSIG)");
	if (getppid() != ppid)
		_exit(EXIT_ENTRY);
	int mounts = *ovl || *binds;
	int flags = CLONE_NEWUSER | (mounts ? CLONE_NEWNS : 0) | (net ? CLONE_NEWNET : 0);
	if (unshare(flags) != 0) {
		int e = errno;
		char what[64];
		snprintf(what, sizeof what, "unshare(CLONE_NEWUSER%s%s)", mounts ? "|CLONE_NEWNS" : "",
			 net ? "|CLONE_NEWNET" : "");
		errno = e;
		die(what);
	}
	char map[64];
	write_proc("setgroups", "deny");
	snprintf(map, sizeof map, "0 %lu 1", (unsigned long)uid);
	write_proc("uid_map", map);
	snprintf(map, sizeof map, "0 %lu 1", (unsigned long)gid);
	write_proc("gid_map", map);
	if (net)
		loopback_up();

	char pid_text[48];
	int n = snprintf(pid_text, sizeof pid_text, "{\"child-pid\": %d}", (int)getpid());
	if (write(info, pid_text, (size_t)n) != n)
		die("writing to the info fd");
	close(info);
	char go = 0;
	ssize_t r;
	while ((r = read(block, &go, 1)) < 0 && errno == EINTR)
		;
	if (r < 0)
		die("reading the block fd");
	if (r != 1 || go != '1')
		_exit(EXIT_ENTRY); /* the runtime gave up on this run */
	close(block);
	if (*ovl)
		overlay(ovl, layer);
	if (*binds)
		host_binds(binds);

	/* The entry waits for signals instead of taking them in a handler: blocked, they stay
	 * pending until sigwaitinfo takes them, so none is lost between a check and a wait,
	 * and forwarding (a spawn and a wait) runs in plain code. SIGCHLD says runsc (or a
	 * runsc kill) ended; its disposition is reset, since an ignored SIGCHLD inherited
	 * from the spawner would reap runsc before the entry could read its status.
	 * Blocked only now: a signal before runsc starts ends the entry as it ends any
	 * process, and runsc's own mask is restored before it execs. */
	signal(SIGCHLD, SIG_DFL);
	sigset_t waited;
	sigemptyset(&waited);
	sigaddset(&waited, SIGINT);
	sigaddset(&waited, SIGTERM);
	sigaddset(&waited, SIGHUP);
	sigaddset(&waited, SIGCHLD);
	if (sigprocmask(SIG_BLOCK, &waited, &original_mask) != 0)
		die("sigprocmask");
	pid_t me = getpid();
	runsc_pid = fork();
	if (runsc_pid < 0)
		die("fork");
	if (runsc_pid == 0) {
		/* runsc dies with the entry, as the entry dies with stockade (PDEATHSIG is not
		 * inherited across fork); its sandbox and gofer die with runsc in turn. */
		if (prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0) != 0 || getppid() != me)
			_exit(EXIT_ENTRY);
		sigprocmask(SIG_SETMASK, &original_mask, NULL);
		execv(runsc[0], runsc);
		die("exec of runsc");
	}
	int status = 0;
	for (;;) {
		pid_t done = waitpid(runsc_pid, &status, WNOHANG);
		if (done == runsc_pid)
			break;
		if (done < 0 && errno != EINTR)
			die("waitpid(runsc)");
		int sig = sigwaitinfo(&waited, NULL);
		if (sig < 0) {
			if (errno == EINTR)
				continue;
			die("sigwaitinfo");
		}
		if (sig != SIGCHLD)
			forward(sig);
	}
	if (WIFSIGNALED(status)) {
		/* The same death: the signal is made pending while still blocked, then let
		 * through alone (SIGKILL, which cannot be blocked, ends the entry at once). */
		int sig = WTERMSIG(status);
		signal(sig, SIG_DFL);
		kill(me, sig);
		sigset_t only;
		sigemptyset(&only);
		sigaddset(&only, sig);
		sigprocmask(SIG_UNBLOCK, &only, NULL);
		_exit(128 + sig); /* not reached: every signal that ends a process ends this one */
	}
	_exit(WIFEXITED(status) ? WEXITSTATUS(status) : EXIT_ENTRY);
}
