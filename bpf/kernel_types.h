/* SPDX-License-Identifier: GPL-2.0 */
/*
 * The few kernel types the programs read, declared with CO-RE relocation: field offsets are
 * resolved against the running kernel's BTF at load time, so one object fits many kernels.
 * Only the fields used are declared; their order and the array bound below do not matter.
 */
#ifndef CEEMS_KERNEL_TYPES_H
#define CEEMS_KERNEL_TYPES_H

#include <linux/types.h>
#include <linux/bpf.h>

#define CORE __attribute__((preserve_access_index))

struct kernfs_node {
	__u64 id;
} CORE;

struct cgroup {
	struct kernfs_node *kn;
} CORE;

struct cgroup_subsys_state {
	struct cgroup *cgroup;
} CORE;

struct css_set {
	struct cgroup_subsys_state *subsys[16];
} CORE;

struct file;

struct fdtable {
	unsigned int max_fds;
	struct file **fd;
} CORE;

struct files_struct {
	struct fdtable *fdt;
} CORE;

struct task_struct {
	struct css_set *cgroups;
	struct files_struct *files;
} CORE;

struct super_block {
	__u32 s_dev;
} CORE;

struct inode {
	__u16 i_mode;
	struct super_block *i_sb;
} CORE;

struct file {
	struct inode *f_inode;
	__u32 f_mode;
} CORE;

struct tcp_sock {
	__u32 segs_in;
	__u32 segs_out;
	__u32 total_retrans;
	__u64 bytes_retrans;
} CORE;

/* Tracepoint records, as /sys/kernel/tracing/events/<event>/format lays them out (an ABI). */
struct syscall_enter {
	__u64 common;
	__s32 nr;
	__u32 pad;
	__u64 args[6];
};

struct syscall_exit {
	__u64 common;
	__s32 nr;
	__u32 pad;
	__s64 ret;
};

/* sock:sock_send_length and sock:sock_recv_length (6.3 and later). */
struct sock_length {
	__u64 common;
	void *sk;
	__u16 family;
	__u16 protocol;
	int ret;
	int flags;
};

/* tcp:tcp_destroy_sock. */
struct tcp_destroy {
	__u64 common;
	const void *skaddr;
};

#endif
