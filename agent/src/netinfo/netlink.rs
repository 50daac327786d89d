//! A small synchronous rtnetlink client: dumps of the links and routes of the calling thread's
//! network namespace, and a route lookup. Requests that only read need no capability.

use std::{
    io,
    net::IpAddr,
    os::fd::{AsRawFd as _, BorrowedFd},
};

use netlink_packet_core::{
    NLM_F_DUMP, NLM_F_REQUEST, NetlinkHeader, NetlinkMessage, NetlinkPayload,
};
use netlink_packet_route::{
    AddressFamily, RouteNetlinkMessage,
    link::LinkMessage,
    nsid::{NsidAttribute, NsidMessage},
    route::{RouteAddress, RouteAttribute, RouteFlags, RouteHeader, RouteMessage},
};
use netlink_sys::{Socket, SocketAddr, protocols::NETLINK_ROUTE};
use thiserror::Error;

#[derive(Debug, Error)]
pub enum NetlinkError {
    #[error("cannot open a netlink socket")]
    Socket(#[source] io::Error),
    #[error("netlink request failed")]
    Io(#[source] io::Error),
    #[error("undecodable netlink reply: {0}")]
    Decode(String),
    #[error("the kernel refused the request")]
    Kernel(#[source] io::Error),
}

/// An rtnetlink socket in the calling thread's network namespace.
pub struct Rtnl {
    socket: Socket,
    sequence: u32,
}

impl Rtnl {
    pub fn open() -> Result<Self, NetlinkError> {
        let mut socket = Socket::new(NETLINK_ROUTE).map_err(NetlinkError::Socket)?;
        socket.bind_auto().map_err(NetlinkError::Socket)?;
        socket
            .connect(&SocketAddr::new(0, 0))
            .map_err(NetlinkError::Socket)?;
        Ok(Self {
            socket,
            sequence: 0,
        })
    }

    /// Sends `message` and collects the replies: until `NLMSG_DONE` for a dump, the first
    /// one otherwise.
    fn request(
        &mut self,
        message: RouteNetlinkMessage,
        dump: bool,
    ) -> Result<Vec<RouteNetlinkMessage>, NetlinkError> {
        self.sequence += 1;
        let mut header = NetlinkHeader::default();
        header.flags = NLM_F_REQUEST | if dump { NLM_F_DUMP } else { 0 };
        header.sequence_number = self.sequence;
        let mut request = NetlinkMessage::new(header, NetlinkPayload::InnerMessage(message));
        request.finalize();
        let mut buf = vec![0; request.buffer_len()];
        request.serialize(&mut buf);
        self.socket.send(&buf, 0).map_err(NetlinkError::Io)?;
        let mut out = Vec::new();
        loop {
            let (bytes, _) = self.socket.recv_from_full().map_err(NetlinkError::Io)?;
            let mut offset = 0;
            while offset < bytes.len() {
                let reply = NetlinkMessage::<RouteNetlinkMessage>::deserialize(&bytes[offset..])
                    .map_err(|e| NetlinkError::Decode(e.to_string()))?;
                let length = reply.header.length as usize;
                if reply.header.sequence_number == self.sequence {
                    match reply.payload {
                        NetlinkPayload::InnerMessage(m) => {
                            out.push(m);
                            if !dump {
                                return Ok(out);
                            }
                        }
                        NetlinkPayload::Done(_) => return Ok(out),
                        NetlinkPayload::Error(e) => {
                            return match e.code {
                                Some(code) => Err(NetlinkError::Kernel(
                                    io::Error::from_raw_os_error(-code.get()),
                                )),
                                None => Ok(out),
                            };
                        }
                        _ => {}
                    }
                }
                if length == 0 {
                    break;
                }
                offset += length;
            }
        }
    }

    /// Every link of the namespace (`ip link show`).
    pub fn links(&mut self) -> Result<Vec<LinkMessage>, NetlinkError> {
        let replies = self.request(RouteNetlinkMessage::GetLink(LinkMessage::default()), true)?;
        Ok(replies
            .into_iter()
            .filter_map(|m| match m {
                RouteNetlinkMessage::NewLink(l) => Some(l),
                _ => None,
            })
            .collect())
    }

    /// Every route of every table of one family (`ip route show table all`).
    pub fn routes(&mut self, family: AddressFamily) -> Result<Vec<RouteMessage>, NetlinkError> {
        let mut m = RouteMessage::default();
        m.header.address_family = family;
        m.header.table = RouteHeader::RT_TABLE_UNSPEC;
        let replies = self.request(RouteNetlinkMessage::GetRoute(m), true)?;
        Ok(replies
            .into_iter()
            .filter_map(|m| match m {
                RouteNetlinkMessage::NewRoute(r) => Some(r),
                _ => None,
            })
            .collect())
    }

    /// The id this namespace gives the namespace `netns` is a file of (`ip netns identify`'s
    /// inverse: `RTM_GETNSID` with `NETNSA_FD`); `None` when it has given it none. A veth names
    /// its peer's namespace by such an id (`IFLA_LINK_NETNSID`), and the kernel assigns one to
    /// each end's namespace in the other when the pair spans two. Needs no capability.
    pub fn nsid_of(&mut self, netns: BorrowedFd<'_>) -> Result<Option<i32>, NetlinkError> {
        let fd = u32::try_from(netns.as_raw_fd())
            .map_err(|_| NetlinkError::Io(io::ErrorKind::InvalidInput.into()))?;
        let mut m = NsidMessage::default();
        m.attributes.push(NsidAttribute::Fd(fd));
        let replies = self.request(RouteNetlinkMessage::GetNsId(m), false)?;
        Ok(replies
            .into_iter()
            .find_map(|m| match m {
                RouteNetlinkMessage::NewNsId(n) => n.attributes.into_iter().find_map(|a| match a {
                    NsidAttribute::Id(id) => Some(id),
                    _ => None,
                }),
                _ => None,
            })
            .filter(|id| *id >= 0))
    }

    /// The route that matches `destination` (`ip route get fibmatch <destination>`).
    pub fn route_to(&mut self, destination: IpAddr) -> Result<Option<RouteMessage>, NetlinkError> {
        let mut m = RouteMessage::default();
        let (family, length) = match destination {
            IpAddr::V4(_) => (AddressFamily::Inet, 32),
            IpAddr::V6(_) => (AddressFamily::Inet6, 128),
        };
        m.header.address_family = family;
        m.header.destination_prefix_length = length;
        m.header.flags = RouteFlags::FibMatch;
        m.attributes
            .push(RouteAttribute::Destination(RouteAddress::from(destination)));
        let replies = self.request(RouteNetlinkMessage::GetRoute(m), false)?;
        Ok(replies.into_iter().find_map(|m| match m {
            RouteNetlinkMessage::NewRoute(r) => Some(r),
            _ => None,
        }))
    }
}
