// SPDX-License-Identifier: GPL-2.0
/*
 * ceems's eBPF sub-collector: file system IO and network traffic per cgroup, counted on
 * tracepoints (system calls, sockets) and read by the exporter from the maps below.
 *
 * Tracepoints, not kprobes or fentry/fexit: their records are an ABI, and they attach on
 * kernels built without kprobes or locked down against tracing programs. A call's file is
 * kept from the syscall's entry to its exit in `inflight`, storage of the task itself (5.12
 * or later), which costs a fraction of a hash map's update and delete. Socket lengths need
 * 6.3 or later.
 *
 * Keys are cgroup ids (the cgroup directory's inode number): on cgroups v2 the task's cgroup,
 * on v1 its cgroup in the hierarchy of subsystem `cgroup_subsys`, which the exporter sets.
 *
 * Built by scripts/build-bpf.sh (`just bpf`) with clang; the object is committed.
 */

#include "kernel_types.h"

#include <bpf/bpf_helpers.h>
#include <bpf/bpf_core_read.h>

char LICENSE[] SEC("license") = "GPL";

/* -1 on cgroups v2; on v1 the subsystem id (its row in /proc/cgroups) whose cgroup keys. */
volatile const int cgroup_subsys = -1;

#define MAX_CGROUPS 16384
#define MAX_SOCKETS 65536
#define S_IFMT 00170000
#define S_IFREG 0100000
#define O_CREAT 0100
#define FMODE_CREATED 0x100000
#define MAX_ERRNO 4095
#define IPPROTO_TCP 6
#define IPPROTO_UDP 17
#define AF_INET 2
#define AF_INET6 10

struct io_key {
	__u64 cgroup;
	__u32 dev;
	__u32 pad;
};

struct io_value {
	__u64 bytes;
	__u64 calls;
	__u64 errors;
};

struct file_ops {
	__u64 open_calls;
	__u64 open_errors;
	__u64 create_calls;
	__u64 create_errors;
	__u64 unlink_calls;
	__u64 unlink_errors;
};

struct net_key {
	__u64 cgroup;
	__u16 proto;
	__u16 family;
	__u32 pad;
};

struct net_value {
	__u64 ingress_packets;
	__u64 ingress_bytes;
	__u64 egress_packets;
	__u64 egress_bytes;
	__u64 retrans_packets;
	__u64 retrans_bytes;
};

/* A TCP socket's counters as last seen, for the segments and retransmissions since. */
struct sock_seen {
	__u64 segs_in;
	__u64 segs_out;
	__u64 retrans;
	__u64 bytes_retrans;
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, MAX_CGROUPS);
	__type(key, struct io_key);
	__type(value, struct io_value);
} reads SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, MAX_CGROUPS);
	__type(key, struct io_key);
	__type(value, struct io_value);
} writes SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, MAX_CGROUPS);
	__type(key, __u64);
	__type(value, struct file_ops);
} file_ops SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, MAX_CGROUPS);
	__type(key, struct net_key);
	__type(value, struct net_value);
} traffic SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, MAX_SOCKETS);
	__type(key, __u64);
	__type(value, struct sock_seen);
} sockets SEC(".maps");

/* What a call in progress was given, from its entry to its return: by task and kind of call. */
enum call {
	CALL_READ = 1,
	CALL_WRITE,
	CALL_OPEN,
};

/* Per task: what each kind of call in progress was given. */
struct calls {
	__u64 arg[4];
};

struct {
	__uint(type, BPF_MAP_TYPE_TASK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct calls);
} inflight SEC(".maps");

/*
 * Keeps `arg` for the call's exit. 0 keeps nothing: it clears what an earlier call of the
 * kind left (one whose exit ran before its program was attached) without making storage for
 * a task that never had any.
 */
static __always_inline void enter(enum call kind, __u64 arg)
{
	struct calls *c = bpf_task_storage_get(&inflight, bpf_get_current_task_btf(), 0,
					       arg ? BPF_LOCAL_STORAGE_GET_F_CREATE : 0);
	if (c && kind < 4)
		c->arg[kind] = arg;
}

/* The argument kept at entry, cleared; 0 when the entry was not seen or not kept. */
static __always_inline __u64 leave(enum call kind)
{
	struct calls *c = bpf_task_storage_get(&inflight, bpf_get_current_task_btf(), 0, 0);
	if (!c || kind >= 4)
		return 0;
	__u64 value = c->arg[kind];
	c->arg[kind] = 0;
	return value;
}

/* Reads through the task's BTF pointer are plain loads, far cheaper than probe-read calls. */
static __always_inline __u64 current_cgroup(void)
{
	int subsys = cgroup_subsys;
	if (subsys < 0)
		return bpf_get_current_cgroup_id();
	if (subsys >= 16)
		return 0;
	struct task_struct *task = bpf_get_current_task_btf();
	struct cgroup_subsys_state *css = task->cgroups->subsys[subsys];
	if (!css)
		return 0;
	return css->cgroup->kn->id;
}

static __always_inline void *lookup_or_init(void *map, const void *key, const void *zero)
{
	void *value = bpf_map_lookup_elem(map, key);
	if (value)
		return value;
	bpf_map_update_elem(map, key, zero, BPF_NOEXIST);
	return bpf_map_lookup_elem(map, key);
}

/* The current task's open file `fd`, or 0. */
static __always_inline struct file *current_file(__u64 fd)
{
	struct task_struct *task = bpf_get_current_task_btf();
	struct fdtable *fdt = task->files->fdt;
	if (!fdt || fd >= fdt->max_fds)
		return 0;
	struct file *file = 0;
	if (bpf_probe_read_kernel(&file, sizeof(file), &fdt->fd[fd]))
		return 0;
	return file;
}

static __always_inline void count_io(void *map, __u32 dev, long ret)
{
	struct io_key key = {
		.cgroup = current_cgroup(),
		.dev = dev,
	};
	if (!key.cgroup)
		return;
	struct io_value zero = {};
	struct io_value *v = lookup_or_init(map, &key, &zero);
	if (!v)
		return;
	__sync_fetch_and_add(&v->calls, 1);
	if (ret < 0)
		__sync_fetch_and_add(&v->errors, 1);
	else
		__sync_fetch_and_add(&v->bytes, ret);
}

/*
 * Kept at entry: the device of the call's file, with bit 32 set, when it is a regular file on
 * a file system (not a pipe, socket, terminal or /proc).
 */
static __always_inline void io_enter(enum call kind, struct syscall_enter *ctx)
{
	__u64 kept = 0;
	struct file *file = current_file(ctx->args[0]);
	struct inode *inode = file ? BPF_CORE_READ(file, f_inode) : 0;
	if (inode && (BPF_CORE_READ(inode, i_mode) & S_IFMT) == S_IFREG)
		kept = (1ULL << 32) | BPF_CORE_READ(inode, i_sb, s_dev);
	enter(kind, kept);
}

static __always_inline void io_exit(enum call kind, void *map, struct syscall_exit *ctx)
{
	__u64 kept = leave(kind);
	if (kept)
		count_io(map, (__u32)kept, ctx->ret);
}

SEC("tracepoint/syscalls/sys_enter_read")
int read_enter(struct syscall_enter *ctx)
{
	io_enter(CALL_READ, ctx);
	return 0;
}

SEC("tracepoint/syscalls/sys_exit_read")
int read_exit(struct syscall_exit *ctx)
{
	io_exit(CALL_READ, &reads, ctx);
	return 0;
}

SEC("tracepoint/syscalls/sys_enter_pread64")
int pread_enter(struct syscall_enter *ctx)
{
	io_enter(CALL_READ, ctx);
	return 0;
}

SEC("tracepoint/syscalls/sys_exit_pread64")
int pread_exit(struct syscall_exit *ctx)
{
	io_exit(CALL_READ, &reads, ctx);
	return 0;
}

SEC("tracepoint/syscalls/sys_enter_write")
int write_enter(struct syscall_enter *ctx)
{
	io_enter(CALL_WRITE, ctx);
	return 0;
}

SEC("tracepoint/syscalls/sys_exit_write")
int write_exit(struct syscall_exit *ctx)
{
	io_exit(CALL_WRITE, &writes, ctx);
	return 0;
}

SEC("tracepoint/syscalls/sys_enter_pwrite64")
int pwrite_enter(struct syscall_enter *ctx)
{
	io_enter(CALL_WRITE, ctx);
	return 0;
}

SEC("tracepoint/syscalls/sys_exit_pwrite64")
int pwrite_exit(struct syscall_exit *ctx)
{
	io_exit(CALL_WRITE, &writes, ctx);
	return 0;
}

static __always_inline struct file_ops *current_file_ops(void)
{
	__u64 cgroup = current_cgroup();
	if (!cgroup)
		return 0;
	struct file_ops zero = {};
	return lookup_or_init(&file_ops, &cgroup, &zero);
}

/* The flags are kept at entry; bit 0 marks "seen" (O_RDONLY is 0). */
static __always_inline void open_enter(__u64 flags)
{
	enter(CALL_OPEN, ((flags & 0xffffffff) << 1) | 1);
}

/* A create is an open with O_CREAT that made the file, or failed. */
static __always_inline void open_exit(struct syscall_exit *ctx)
{
	__u64 kept = leave(CALL_OPEN);
	if (!kept)
		return;
	__u64 flags = kept >> 1;
	struct file_ops *ops = current_file_ops();
	if (!ops)
		return;
	long ret = ctx->ret;
	__sync_fetch_and_add(&ops->open_calls, 1);
	if (ret < 0)
		__sync_fetch_and_add(&ops->open_errors, 1);
	if (!(flags & O_CREAT))
		return;
	if (ret < 0) {
		__sync_fetch_and_add(&ops->create_calls, 1);
		__sync_fetch_and_add(&ops->create_errors, 1);
		return;
	}
	struct file *file = current_file(ret);
	if (file && (BPF_CORE_READ(file, f_mode) & FMODE_CREATED))
		__sync_fetch_and_add(&ops->create_calls, 1);
}

SEC("tracepoint/syscalls/sys_enter_openat")
int openat_enter(struct syscall_enter *ctx)
{
	open_enter(ctx->args[2]);
	return 0;
}

SEC("tracepoint/syscalls/sys_exit_openat")
int openat_exit(struct syscall_exit *ctx)
{
	open_exit(ctx);
	return 0;
}

SEC("tracepoint/syscalls/sys_enter_open")
int open_enter_legacy(struct syscall_enter *ctx)
{
	open_enter(ctx->args[1]);
	return 0;
}

SEC("tracepoint/syscalls/sys_exit_open")
int open_exit_legacy(struct syscall_exit *ctx)
{
	open_exit(ctx);
	return 0;
}

static __always_inline void unlink_exit(struct syscall_exit *ctx)
{
	struct file_ops *ops = current_file_ops();
	if (!ops)
		return;
	__sync_fetch_and_add(&ops->unlink_calls, 1);
	if (ctx->ret < 0)
		__sync_fetch_and_add(&ops->unlink_errors, 1);
}

SEC("tracepoint/syscalls/sys_exit_unlinkat")
int unlinkat_exit(struct syscall_exit *ctx)
{
	unlink_exit(ctx);
	return 0;
}

SEC("tracepoint/syscalls/sys_exit_unlink")
int unlink_exit_legacy(struct syscall_exit *ctx)
{
	unlink_exit(ctx);
	return 0;
}

/* Adds the TCP socket's segments and retransmissions since it was last seen. */
static __always_inline void tcp_segments(void *sk, struct net_value *v)
{
	struct tcp_sock *tp = (struct tcp_sock *)sk;
	struct sock_seen now = {
		.segs_in = BPF_CORE_READ(tp, segs_in),
		.segs_out = BPF_CORE_READ(tp, segs_out),
		.retrans = BPF_CORE_READ(tp, total_retrans),
		.bytes_retrans = BPF_CORE_READ(tp, bytes_retrans),
	};
	__u64 key = (__u64)sk;
	struct sock_seen *seen = bpf_map_lookup_elem(&sockets, &key);
	struct sock_seen before = {};
	/* A socket seen before at this address that counts less now is a new one. */
	if (seen && seen->segs_out <= now.segs_out && seen->segs_in <= now.segs_in)
		before = *seen;
	__sync_fetch_and_add(&v->ingress_packets, now.segs_in - before.segs_in);
	__sync_fetch_and_add(&v->egress_packets, now.segs_out - before.segs_out);
	if (now.retrans >= before.retrans)
		__sync_fetch_and_add(&v->retrans_packets, now.retrans - before.retrans);
	if (now.bytes_retrans >= before.bytes_retrans)
		__sync_fetch_and_add(&v->retrans_bytes, now.bytes_retrans - before.bytes_retrans);
	bpf_map_update_elem(&sockets, &key, &now, BPF_ANY);
}

static __always_inline void count_socket(struct sock_length *ctx, int egress)
{
	if (ctx->family != AF_INET && ctx->family != AF_INET6)
		return;
	if (ctx->protocol != IPPROTO_TCP && ctx->protocol != IPPROTO_UDP)
		return;
	struct net_key key = {
		.cgroup = current_cgroup(),
		.proto = ctx->protocol,
		.family = ctx->family,
	};
	if (!key.cgroup)
		return;
	struct net_value zero = {};
	struct net_value *v = lookup_or_init(&traffic, &key, &zero);
	if (!v)
		return;
	if (ctx->protocol == IPPROTO_TCP) {
		tcp_segments(ctx->sk, v);
	} else if (ctx->ret > 0) {
		if (egress)
			__sync_fetch_and_add(&v->egress_packets, 1);
		else
			__sync_fetch_and_add(&v->ingress_packets, 1);
	}
	if (ctx->ret > 0) {
		if (egress)
			__sync_fetch_and_add(&v->egress_bytes, ctx->ret);
		else
			__sync_fetch_and_add(&v->ingress_bytes, ctx->ret);
	}
}

SEC("tracepoint/sock/sock_send_length")
int send_length(struct sock_length *ctx)
{
	count_socket(ctx, 1);
	return 0;
}

SEC("tracepoint/sock/sock_recv_length")
int recv_length(struct sock_length *ctx)
{
	count_socket(ctx, 0);
	return 0;
}

SEC("tracepoint/tcp/tcp_destroy_sock")
int tcp_destroy(struct tcp_destroy *ctx)
{
	__u64 key = (__u64)ctx->skaddr;
	bpf_map_delete_elem(&sockets, &key);
	return 0;
}
