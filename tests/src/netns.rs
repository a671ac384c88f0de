//! Network namespaces for relayed "machines" (issue 20 item 4): each
//! machine gets a Linux network namespace of its own, joined to this
//! process's namespace by a veth pair on a /30 of its own, so its relay
//! reaches the central service only over that link, from the machine's
//! own address, as a separate machine would.
//!
//! Invariants:
//! - A link's /30 is subnet number `s` of `SUBNETS`, 10.213.0.0/16 (`10.213.s/64.4(s%64)`;
//!   `.1` on this side, `.2` the machine's), and both the link (`shmt<s>`)
//!   and the namespace (`shmtrace-<pid>-<s>`, `pid` the creating process's)
//!   are named after it: creating the link claims the subnet, so runs in
//!   parallel, in this process or others, never share one; a subnet whose
//!   link exists, or that holds an address of this machine, is skipped.
//! - A [`MachineNetwork`] deletes its link and namespace when dropped,
//!   also when a run fails or panics. [`MachineNetwork::create`] first
//!   deletes the `shmtrace-<pid>-*` namespaces of processes that no longer
//!   exist (what a killed run left).
//! - Programs are put into the namespace with `ip netns exec`, which
//!   executes the program in place (no fork): the process spawned is the
//!   program, with its environment, working directory and standard streams.
//!
//! Nothing here routes beyond the link: a machine's namespace holds its
//! loopback and its end of the link only, with no default route, so it
//! reaches this machine's side of its own link and nothing else.

use std::net::{Ipv4Addr, SocketAddrV4};
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

use crate::error::{HarnessError, Result};
use crate::process;

/// The private range the links' /30s come from: 10.213.0.0/16.
const SUBNETS: Ipv4Addr = Ipv4Addr::new(10, 213, 0, 0);

/// /30s in [`SUBNETS`].
const SUBNET_COUNT: u32 = 1 << 14;

/// Subnets tried before giving up.
const ATTEMPTS: u32 = 64;

/// The prefix of the namespaces' names.
const PREFIX: &str = "shmtrace-";

/// Spreads the subnets this process picks (see [`MachineNetwork::create`]).
static NEXT: AtomicU32 = AtomicU32::new(0);

/// One relayed machine's network namespace and its link to this one.
#[derive(Debug)]
pub struct MachineNetwork {
    subnet: u32,
    namespace: String,
    /// The link, once this run made it.
    link: Option<String>,
}

impl MachineNetwork {
    /// Makes a namespace with `lo` up and a veth link to this namespace on
    /// a /30 no other run uses, both ends up and addressed. An error says
    /// why this machine cannot (no `ip`, no right to make namespaces).
    pub fn create() -> Result<Self> {
        remove_stale();
        let taken = local_ipv4_addresses()?;
        let pid = std::process::id();
        let start = pid
            .wrapping_mul(61)
            .wrapping_add(NEXT.fetch_add(1, Ordering::Relaxed));
        let mut last_error = String::new();
        for attempt in 0..ATTEMPTS {
            let subnet = start.wrapping_add(attempt) % SUBNET_COUNT;
            let base = u32::from(address(subnet, 0));
            if taken.iter().any(|&a| u32::from(a) & !3 == base) {
                continue;
            }
            let namespace = format!("{PREFIX}{pid}-{subnet}");
            match ip(&["netns", "add", &namespace]) {
                Ok(()) => {}
                // A run of this process, or of an earlier one with this
                // pid, has it.
                Err(e) if e.contains("File exists") => {
                    last_error = e;
                    continue;
                }
                Err(e) => return Err(unavailable(e)),
            }
            let mut network = MachineNetwork {
                subnet,
                namespace,
                link: None,
            };
            let link = format!("shmt{subnet}");
            match network.add_link(&link) {
                Ok(()) => network.link = Some(link.clone()),
                // Another process's subnet: try the next (dropping
                // `network` deletes the namespace only).
                Err(e) if e.contains("File exists") => {
                    last_error = e;
                    continue;
                }
                Err(e) => return Err(unavailable(e)),
            }
            network.set_up(&link).map_err(unavailable)?;
            return Ok(network);
        }
        Err(unavailable(format!(
            "no free subnet in {ATTEMPTS} attempts; last: {last_error}"
        )))
    }

    fn add_link(&self, link: &str) -> Result<(), String> {
        let ns = self.namespace.as_str();
        ip(&[
            "link", "add", link, "type", "veth", "peer", "name", "eth0", "netns", ns,
        ])
    }

    fn set_up(&self, link: &str) -> Result<(), String> {
        let ns = self.namespace.as_str();
        let here = format!("{}/30", self.central_address());
        let there = format!("{}/30", self.machine_address());
        ip(&["addr", "add", &here, "dev", link])?;
        ip(&["link", "set", link, "up"])?;
        ip(&["-n", ns, "addr", "add", &there, "dev", "eth0"])?;
        ip(&["-n", ns, "link", "set", "eth0", "up"])?;
        ip(&["-n", ns, "link", "set", "lo", "up"])
    }

    /// This namespace's end of the link: where the central service
    /// listens for this machine.
    pub fn central_address(&self) -> Ipv4Addr {
        address(self.subnet, 1)
    }

    /// The machine's end of the link: its own address, the source of its
    /// connections to the central service.
    pub fn machine_address(&self) -> Ipv4Addr {
        address(self.subnet, 2)
    }

    /// The namespace's name (`ip netns`).
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// `command` as it runs in the machine's namespace: under `ip netns
    /// exec`, with the same environment changes.
    pub fn wrap(&self, command: Command) -> Command {
        let mut wrapper = Command::new("ip");
        wrapper.args(["netns", "exec", &self.namespace]);
        process::wrapped(wrapper, &command)
    }
}

impl Drop for MachineNetwork {
    fn drop(&mut self) {
        // The link would go with the namespace once the namespace's last
        // process is gone; deleting it first ends it now.
        if let Some(link) = &self.link {
            let _ = ip(&["link", "del", link]);
        }
        if let Err(e) = ip(&["netns", "del", &self.namespace]) {
            eprintln!("cannot delete network namespace {}: {e}", self.namespace);
        }
    }
}

/// Address `host` (0 to 3) of /30 number `subnet` of [`SUBNETS`].
fn address(subnet: u32, host: u32) -> Ipv4Addr {
    Ipv4Addr::from(u32::from(SUBNETS) + subnet * 4 + host)
}

/// Runs `ip ARGS`; an error carries the command and what it said.
fn ip(args: &[&str]) -> Result<(), String> {
    let output = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("cannot run `ip` (iproute2): {e}"))?;
    if output.status.success() {
        Ok(())
    } else {
        Err(format!(
            "`ip {}` exited {}: {}",
            args.join(" "),
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        ))
    }
}

fn unavailable(detail: String) -> HarnessError {
    HarnessError::Scenario(format!(
        "relayed machines need network namespaces of their own (`ip netns` and veth links \
         from iproute2, root or CAP_SYS_ADMIN and CAP_NET_ADMIN), and this machine cannot \
         give them: {detail}"
    ))
}

/// This namespace's IPv4 addresses.
fn local_ipv4_addresses() -> Result<Vec<Ipv4Addr>> {
    let output = Command::new("ip")
        .args(["-o", "-4", "addr", "show"])
        .output()
        .map_err(|e| unavailable(format!("cannot run `ip` (iproute2): {e}")))?;
    let text = String::from_utf8_lossy(&output.stdout);
    Ok(text
        .lines()
        .filter_map(|line| {
            let mut words = line.split_whitespace();
            words.find(|&w| w == "inet")?;
            words.next()?.split('/').next()?.parse().ok()
        })
        .collect())
}

/// Deletes the namespaces named `shmtrace-<pid>-<subnet>` whose creating
/// process no longer exists (a run killed before it could clean up); their
/// links go with them once no process is left inside. (One whose pid came
/// back to life is left alone: its subnet is merely skipped.)
fn remove_stale() {
    let Ok(output) = Command::new("ip").args(["netns", "list"]).output() else {
        return;
    };
    for line in String::from_utf8_lossy(&output.stdout).lines() {
        let Some(name) = line.split_whitespace().next() else {
            continue;
        };
        let Some((pid, subnet)) = name.strip_prefix(PREFIX).and_then(|r| r.split_once('-')) else {
            continue;
        };
        let (Ok(pid), Ok(_)) = (pid.parse::<u32>(), subnet.parse::<u32>()) else {
            continue;
        };
        if !Path::new(&format!("/proc/{pid}")).exists() {
            let _ = ip(&["netns", "del", name]);
        }
    }
}

/// An established TCP connection, from the listening side.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TcpConnection {
    /// Its local end (the listening address and port).
    pub local: SocketAddrV4,
    /// Its remote end.
    pub peer: SocketAddrV4,
}

/// The established IPv4 TCP connections to local port `port` in this
/// process's network namespace (`/proc/self/net/tcp`).
pub fn connections_to(port: u16) -> Result<Vec<TcpConnection>> {
    let path = Path::new("/proc/self/net/tcp");
    let text = std::fs::read_to_string(path).map_err(|source| HarnessError::Io {
        action: "reading",
        path: path.into(),
        source,
    })?;
    let mut connections: Vec<TcpConnection> = parse_tcp_table(&text)
        .into_iter()
        .filter(|c| c.local.port() == port)
        .collect();
    // The kernel prints the table a page at a time: a connection opened or
    // closed meanwhile can make it print another one twice. A connection
    // is its two endpoints, so a repeat is that, not a second connection.
    let mut seen = Vec::new();
    connections.retain(|c| {
        let new = !seen.contains(c);
        seen.push(*c);
        new
    });
    Ok(connections)
}

/// The established connections of a `/proc/net/tcp` table: each line's
/// `local_address` and `rem_address` (`XXXXXXXX:PPPP`, the address as the
/// kernel holds it, in network byte order, printed as a native-endian
/// number; the port in hex) when its state (`st`) is 01, established.
fn parse_tcp_table(text: &str) -> Vec<TcpConnection> {
    let endpoint = |field: &str| -> Option<SocketAddrV4> {
        let (address, port) = field.split_once(':')?;
        let address = u32::from_str_radix(address, 16).ok()?;
        let port = u16::from_str_radix(port, 16).ok()?;
        Some(SocketAddrV4::new(
            Ipv4Addr::from(address.to_ne_bytes()),
            port,
        ))
    };
    text.lines()
        .skip(1)
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            if fields.get(3) != Some(&"01") {
                return None;
            }
            Some(TcpConnection {
                local: endpoint(fields.get(1)?)?,
                peer: endpoint(fields.get(2)?)?,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_established_connections_of_a_tcp_table() {
        // Two lines of a little-endian machine's /proc/net/tcp: a listener
        // on 10.213.0.1:8080 and a connection to it from 10.213.0.2:40000.
        let table = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when \
                     retrnsmt   uid  timeout inode\n\
   0: 0100D50A:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1 1\n\
   1: 0100D50A:1F90 0200D50A:9C40 01 00000000:00000000 00:00000000 00000000     0        0 2 1\n";
        let connections = parse_tcp_table(table);
        if cfg!(target_endian = "little") {
            assert_eq!(
                connections,
                [TcpConnection {
                    local: "10.213.0.1:8080".parse().unwrap(),
                    peer: "10.213.0.2:40000".parse().unwrap(),
                }]
            );
        } else {
            assert_eq!(connections.len(), 1);
        }
    }

    #[test]
    fn subnets_are_the_documented_30s() {
        assert_eq!(address(0, 1), Ipv4Addr::new(10, 213, 0, 1));
        assert_eq!(address(0, 2), Ipv4Addr::new(10, 213, 0, 2));
        assert_eq!(address(65, 1), Ipv4Addr::new(10, 213, 1, 5));
        assert_eq!(
            address(SUBNET_COUNT - 1, 2),
            Ipv4Addr::new(10, 213, 255, 254)
        );
    }
}
