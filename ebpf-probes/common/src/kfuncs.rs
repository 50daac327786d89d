//! Kernel functions (kfuncs) the probes call, and how their calls reach the kernel.
//!
//! One so far: `bpf_rdonly_cast(ptr, btf_id)` (Linux 6.2+), which tells the verifier that an
//! address is a read-only pointer to a kernel struct, so that its fields are read with direct,
//! fault-tolerant loads instead of a `bpf_probe_read_kernel` call each. The verifier replaces the
//! call with a register move: it costs nothing at run time, where a helper call costs 30–40 ns
//! on the AMD VM (its SRSO mitigation makes every return dearer; issue #43's measurements).
//!
//! aya resolves kfunc calls from the object's BTF (`.ksyms`), which the Rust toolchain does not
//! emit for extern functions. So a probe emits the call as a helper call to [`RDONLY_CAST_MARKER`]
//! (no such helper exists), and the agent rewrites each such instruction before the object is
//! loaded: into the kfunc call, with the function's id in the running kernel's BTF, where the
//! kernel has it; into `r0 = r1` (what the verifier would make of it) where it has not. The
//! probes only take the cast's path when [`globals::HAVE_RDONLY_CAST`] is 1, so on a kernel
//! without the kfunc that path is dead code, which the verifier never checks.

/// The immediate of the placeholder call: an id no BPF helper has.
pub const RDONLY_CAST_MARKER: i32 = 0x7ead_ca57;

/// The read-only globals of the cast.
pub mod globals {
    /// 1 when the markers were rewritten into calls of `bpf_rdonly_cast` and the struct ids
    /// below are set.
    pub const HAVE_RDONLY_CAST: &str = "HAVE_RDONLY_CAST";
    /// BTF ids in the running kernel of the structs the network probes read through the cast:
    /// `struct skb_shared_info` (GSO size and segments), `struct iphdr`, `struct udphdr` (the
    /// first four bytes of a transport header: ports, or ICMP's type and code).
    pub const SKB_SHARED_INFO_BTF_ID: &str = "SKB_SHARED_INFO_BTF_ID";
    pub const IPHDR_BTF_ID: &str = "IPHDR_BTF_ID";
    pub const UDPHDR_BTF_ID: &str = "UDPHDR_BTF_ID";
}
