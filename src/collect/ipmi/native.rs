//! DCMI Get Power Reading through the kernel's OpenIPMI driver (`/dev/ipmi0`), with no external
//! tool. The driver is reached through [`IpmiDriver`], so the request and response handling is
//! tested against a fake that answers as the driver does.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::raw::c_long;
use std::path::Path;
use std::time::Duration;

use super::parse::PowerReading;

/// `IPMI_NETFN_DCGRP` (DCMI's group extension network function).
pub const NETFN_GROUP_EXTENSION: u8 = 0x2c;
/// DCMI "Get Power Reading".
pub const CMD_GET_POWER_READING: u8 = 0x02;
/// DCMI's group extension identification byte, first in every DCMI request and response.
pub const DCMI_GROUP_ID: u8 = 0xdc;
/// Mode 1: system power statistics.
const MODE_SYSTEM_POWER: u8 = 0x01;

const IPMI_SYSTEM_INTERFACE_ADDR_TYPE: i32 = 0x0c;
const IPMI_BMC_CHANNEL: i16 = 0x0f;
const IPMI_RESPONSE_RECV_TYPE: i32 = 1;

/// `struct ipmi_msg` of `<linux/ipmi.h>`.
#[repr(C)]
#[derive(Debug)]
pub struct IpmiMsg {
    pub netfn: u8,
    pub cmd: u8,
    pub data_len: u16,
    pub data: *mut u8,
}

/// `struct ipmi_req`.
#[repr(C)]
#[derive(Debug)]
pub struct IpmiReq {
    pub addr: *mut u8,
    pub addr_len: u32,
    pub msgid: c_long,
    pub msg: IpmiMsg,
}

/// `struct ipmi_recv`.
#[repr(C)]
#[derive(Debug)]
pub struct IpmiRecv {
    pub recv_type: i32,
    pub addr: *mut u8,
    pub addr_len: u32,
    pub msgid: c_long,
    pub msg: IpmiMsg,
}

/// `struct ipmi_system_interface_addr`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SystemInterfaceAddr {
    pub addr_type: i32,
    pub channel: i16,
    pub lun: u8,
}

/// The three operations of the OpenIPMI character device that a request needs.
pub trait IpmiDriver {
    /// `IPMICTL_SEND_COMMAND`.
    fn send(&mut self, req: &mut IpmiReq) -> io::Result<()>;
    /// Waits until a response is ready; false on timeout.
    fn wait_readable(&mut self, timeout: Duration) -> io::Result<bool>;
    /// `IPMICTL_RECEIVE_MSG_TRUNC`: fills `recv`, truncating data to `recv.msg.data_len`.
    fn receive(&mut self, recv: &mut IpmiRecv) -> io::Result<()>;
}

#[derive(Debug, thiserror::Error)]
pub enum NativeError {
    #[error("IPMI driver: {0}")]
    Io(#[from] io::Error),
    #[error("no answer from the BMC within {0:?}")]
    Timeout(Duration),
    #[error("BMC answered with completion code {0:#04x}")]
    Completion(u8),
    #[error("malformed DCMI response: {0}")]
    Malformed(String),
    #[error("the BMC reports its power measurement as inactive")]
    Inactive,
}

/// The data bytes of a DCMI Get Power Reading request for system power statistics.
pub fn encode_power_request() -> [u8; 4] {
    [DCMI_GROUP_ID, MODE_SYSTEM_POWER, 0x00, 0x00]
}

/// Decodes a Get Power Reading response (completion code first).
pub fn decode_power_response(data: &[u8]) -> Result<PowerReading, NativeError> {
    let Some(&code) = data.first() else {
        return Err(NativeError::Malformed("empty response".into()));
    };
    if code != 0 {
        return Err(NativeError::Completion(code));
    }
    if data.len() < 19 {
        return Err(NativeError::Malformed(format!(
            "{} bytes, expected 19",
            data.len()
        )));
    }
    if data[1] != DCMI_GROUP_ID {
        return Err(NativeError::Malformed(format!(
            "group extension id {:#04x}, expected 0xdc",
            data[1]
        )));
    }
    let word = |i: usize| f64::from(u16::from_le_bytes([data[i], data[i + 1]]));
    // Byte 18, bit 6: power measurement active.
    if data[18] & 0x40 == 0 {
        return Err(NativeError::Inactive);
    }
    Ok(PowerReading {
        current: Some(word(2)),
        min: Some(word(4)),
        max: Some(word(6)),
        avg: Some(word(8)),
    })
}

/// Sends one request to the BMC and returns the response data (completion code first).
pub fn exchange(
    driver: &mut dyn IpmiDriver,
    msgid: c_long,
    netfn: u8,
    cmd: u8,
    data: &[u8],
    timeout: Duration,
) -> Result<Vec<u8>, NativeError> {
    let mut addr = SystemInterfaceAddr {
        addr_type: IPMI_SYSTEM_INTERFACE_ADDR_TYPE,
        channel: IPMI_BMC_CHANNEL,
        lun: 0,
    };
    let mut payload = data.to_vec();
    let mut req = IpmiReq {
        addr: (&mut addr as *mut SystemInterfaceAddr).cast(),
        addr_len: std::mem::size_of::<SystemInterfaceAddr>() as u32,
        msgid,
        msg: IpmiMsg {
            netfn,
            cmd,
            data_len: payload.len() as u16,
            data: payload.as_mut_ptr(),
        },
    };
    driver.send(&mut req)?;
    let mut resp_addr = SystemInterfaceAddr {
        addr_type: 0,
        channel: 0,
        lun: 0,
    };
    let mut buf = vec![0u8; 256];
    // Responses to other requests (another process on the same fd is impossible, but a late
    // answer to our own earlier, timed-out request is not) are read and dropped.
    for _ in 0..4 {
        if !driver.wait_readable(timeout)? {
            return Err(NativeError::Timeout(timeout));
        }
        let mut recv = IpmiRecv {
            recv_type: 0,
            addr: (&mut resp_addr as *mut SystemInterfaceAddr).cast(),
            addr_len: std::mem::size_of::<SystemInterfaceAddr>() as u32,
            msgid: 0,
            msg: IpmiMsg {
                netfn: 0,
                cmd: 0,
                data_len: buf.len() as u16,
                data: buf.as_mut_ptr(),
            },
        };
        driver.receive(&mut recv)?;
        if recv.recv_type != IPMI_RESPONSE_RECV_TYPE || recv.msgid != msgid {
            continue;
        }
        if recv.msg.netfn != netfn | 1 || recv.msg.cmd != cmd {
            return Err(NativeError::Malformed(format!(
                "answer to netfn {:#04x} cmd {:#04x}",
                recv.msg.netfn, recv.msg.cmd
            )));
        }
        let len = usize::from(recv.msg.data_len).min(buf.len());
        buf.truncate(len);
        return Ok(buf);
    }
    Err(NativeError::Malformed(
        "no response matching the request".into(),
    ))
}

/// One DCMI power reading through `driver`.
pub fn read_power(
    driver: &mut dyn IpmiDriver,
    msgid: c_long,
    timeout: Duration,
) -> Result<PowerReading, NativeError> {
    let data = exchange(
        driver,
        msgid,
        NETFN_GROUP_EXTENSION,
        CMD_GET_POWER_READING,
        &encode_power_request(),
        timeout,
    )?;
    decode_power_response(&data)
}

/// Transport network function (LAN configuration).
pub const NETFN_TRANSPORT: u8 = 0x0c;
/// "Get LAN Configuration Parameters".
pub const CMD_GET_LAN_CONFIG: u8 = 0x02;
/// Parameter 3: the BMC's IP address.
const LAN_PARAM_IP_ADDRESS: u8 = 0x03;

/// Decodes a Get LAN Configuration Parameters (IP address) response.
pub fn decode_lan_ip(data: &[u8]) -> Result<std::net::Ipv4Addr, NativeError> {
    match data {
        [0, _revision, a, b, c, d, ..] => Ok(std::net::Ipv4Addr::new(*a, *b, *c, *d)),
        [0, ..] => Err(NativeError::Malformed(format!(
            "{} bytes, expected 6",
            data.len()
        ))),
        [code, ..] => Err(NativeError::Completion(*code)),
        [] => Err(NativeError::Malformed("empty response".into())),
    }
}

/// The IP address of the BMC's LAN channel `channel`.
pub fn read_lan_ip(
    driver: &mut dyn IpmiDriver,
    msgid: c_long,
    channel: u8,
    timeout: Duration,
) -> Result<std::net::Ipv4Addr, NativeError> {
    let data = exchange(
        driver,
        msgid,
        NETFN_TRANSPORT,
        CMD_GET_LAN_CONFIG,
        &[channel, LAN_PARAM_IP_ADDRESS, 0, 0],
        timeout,
    )?;
    decode_lan_ip(&data)
}

nix::ioctl_read!(ipmictl_send_command, b'i', 13, IpmiReq);
nix::ioctl_readwrite!(ipmictl_receive_msg_trunc, b'i', 11, IpmiRecv);

/// The real driver: an open OpenIPMI character device.
pub struct OpenIpmiDevice {
    file: File,
}

impl OpenIpmiDevice {
    pub fn open(path: &Path) -> io::Result<OpenIpmiDevice> {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)?;
        Ok(OpenIpmiDevice { file })
    }
}

fn ioctl_error(e: nix::errno::Errno) -> io::Error {
    if e == nix::errno::Errno::ENOTTY {
        io::Error::other("not an OpenIPMI device (ENOTTY)")
    } else {
        io::Error::from(e)
    }
}

impl IpmiDriver for OpenIpmiDevice {
    fn send(&mut self, req: &mut IpmiReq) -> io::Result<()> {
        // SAFETY: `req` points at live buffers owned by the caller for the whole call, sized
        // as their length fields say; the driver copies them before returning.
        unsafe { ipmictl_send_command(self.file.as_raw_fd(), req) }
            .map(drop)
            .map_err(ioctl_error)
    }

    fn wait_readable(&mut self, timeout: Duration) -> io::Result<bool> {
        use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
        use std::os::fd::AsFd;
        let mut fds = [PollFd::new(self.file.as_fd(), PollFlags::POLLIN)];
        let ms = u16::try_from(timeout.as_millis()).unwrap_or(u16::MAX);
        let n = poll(&mut fds, PollTimeout::from(ms)).map_err(io::Error::from)?;
        Ok(n > 0)
    }

    fn receive(&mut self, recv: &mut IpmiRecv) -> io::Result<()> {
        // SAFETY: as in `send`; the driver writes at most `recv.msg.data_len` bytes to data.
        unsafe { ipmictl_receive_msg_trunc(self.file.as_raw_fd(), recv) }
            .map(drop)
            .map_err(ioctl_error)
    }
}

/// A driver whose BMC is a function from (netfn, cmd, request data) to response data
/// (completion code first): the native path's requests carried by another transport, as
/// the tests carry them to a simulated BMC through `ipmitool raw`.
pub struct FnDriver<F: FnMut(u8, u8, &[u8]) -> Vec<u8>> {
    answer: F,
    pending: Option<(c_long, u8, u8, Vec<u8>)>,
}

impl<F: FnMut(u8, u8, &[u8]) -> Vec<u8>> FnDriver<F> {
    pub fn new(answer: F) -> Self {
        FnDriver {
            answer,
            pending: None,
        }
    }
}

impl<F: FnMut(u8, u8, &[u8]) -> Vec<u8>> IpmiDriver for FnDriver<F> {
    fn send(&mut self, req: &mut IpmiReq) -> io::Result<()> {
        let data = if req.msg.data.is_null() || req.msg.data_len == 0 {
            Vec::new()
        } else {
            // SAFETY: `exchange` built the request from a live buffer of data_len bytes.
            unsafe { std::slice::from_raw_parts(req.msg.data, usize::from(req.msg.data_len)) }
                .to_vec()
        };
        let response = (self.answer)(req.msg.netfn, req.msg.cmd, &data);
        self.pending = Some((req.msgid, req.msg.netfn, req.msg.cmd, response));
        Ok(())
    }

    fn wait_readable(&mut self, _: Duration) -> io::Result<bool> {
        Ok(self.pending.is_some())
    }

    fn receive(&mut self, recv: &mut IpmiRecv) -> io::Result<()> {
        let (msgid, netfn, cmd, response) = self
            .pending
            .take()
            .ok_or_else(|| io::Error::from_raw_os_error(nix::libc::EAGAIN))?;
        recv.recv_type = IPMI_RESPONSE_RECV_TYPE;
        recv.msgid = msgid;
        recv.msg.netfn = netfn | 1;
        recv.msg.cmd = cmd;
        let n = response.len().min(usize::from(recv.msg.data_len));
        // SAFETY: `exchange` gave a buffer of data_len bytes.
        unsafe { std::ptr::copy_nonoverlapping(response.as_ptr(), recv.msg.data, n) };
        recv.msg.data_len = n as u16;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Answers as the OpenIPMI driver does, with a canned BMC response, and records what it
    /// was sent.
    struct FakeDriver {
        response: Vec<u8>,
        pending: Option<(c_long, u8, u8)>,
        seen: Vec<(SystemInterfaceAddr, u8, u8, Vec<u8>)>,
        stray_first: bool,
        silent: bool,
    }

    impl FakeDriver {
        fn new(response: Vec<u8>) -> FakeDriver {
            FakeDriver {
                response,
                pending: None,
                seen: Vec::new(),
                stray_first: false,
                silent: false,
            }
        }
    }

    impl IpmiDriver for FakeDriver {
        fn send(&mut self, req: &mut IpmiReq) -> io::Result<()> {
            if req.addr_len as usize != std::mem::size_of::<SystemInterfaceAddr>() {
                return Err(io::Error::from_raw_os_error(nix::libc::EINVAL));
            }
            // SAFETY: the test's own request, built by `exchange` with live buffers.
            let (addr, data) = unsafe {
                (
                    *(req.addr as *const SystemInterfaceAddr),
                    std::slice::from_raw_parts(req.msg.data, usize::from(req.msg.data_len))
                        .to_vec(),
                )
            };
            self.seen.push((addr, req.msg.netfn, req.msg.cmd, data));
            self.pending = Some((req.msgid, req.msg.netfn, req.msg.cmd));
            Ok(())
        }

        fn wait_readable(&mut self, _: Duration) -> io::Result<bool> {
            Ok(!self.silent && self.pending.is_some())
        }

        fn receive(&mut self, recv: &mut IpmiRecv) -> io::Result<()> {
            let (msgid, netfn, cmd) = self
                .pending
                .ok_or_else(|| io::Error::from_raw_os_error(nix::libc::EAGAIN))?;
            recv.recv_type = IPMI_RESPONSE_RECV_TYPE;
            recv.msgid = if self.stray_first { msgid + 100 } else { msgid };
            self.stray_first = false;
            recv.msg.netfn = netfn | 1;
            recv.msg.cmd = cmd;
            let n = self.response.len().min(usize::from(recv.msg.data_len));
            // SAFETY: `exchange` gave a buffer of data_len bytes.
            unsafe { std::ptr::copy_nonoverlapping(self.response.as_ptr(), recv.msg.data, n) };
            recv.msg.data_len = n as u16;
            Ok(())
        }
    }

    /// 344 W now, 271 min, 405 max, 319 avg, active.
    fn good_response() -> Vec<u8> {
        vec![
            0x00, 0xdc, 0x58, 0x01, 0x0f, 0x01, 0x95, 0x01, 0x3f, 0x01, 0x10, 0x20, 0x30, 0x40,
            0xe8, 0x03, 0x00, 0x00, 0x40,
        ]
    }

    #[test]
    fn request_bytes() {
        assert_eq!(encode_power_request(), [0xdc, 0x01, 0x00, 0x00]);
        let mut fake = FakeDriver::new(good_response());
        read_power(&mut fake, 7, Duration::from_secs(1)).unwrap();
        let (addr, netfn, cmd, data) = &fake.seen[0];
        assert_eq!(
            *addr,
            SystemInterfaceAddr {
                addr_type: 0x0c,
                channel: 0x0f,
                lun: 0
            }
        );
        assert_eq!((*netfn, *cmd), (0x2c, 0x02));
        assert_eq!(data, &[0xdc, 0x01, 0x00, 0x00]);
    }

    #[test]
    fn response_bytes() {
        assert_eq!(
            decode_power_response(&good_response()).unwrap(),
            PowerReading {
                current: Some(344.0),
                min: Some(271.0),
                max: Some(405.0),
                avg: Some(319.0),
            }
        );
        let mut inactive = good_response();
        inactive[18] = 0;
        assert!(matches!(
            decode_power_response(&inactive),
            Err(NativeError::Inactive)
        ));
        assert!(matches!(
            decode_power_response(&[0xd5]),
            Err(NativeError::Completion(0xd5))
        ));
        assert!(matches!(
            decode_power_response(&good_response()[..10]),
            Err(NativeError::Malformed(_))
        ));
        let mut wrong_group = good_response();
        wrong_group[1] = 0x00;
        assert!(matches!(
            decode_power_response(&wrong_group),
            Err(NativeError::Malformed(_))
        ));
        assert!(matches!(
            decode_power_response(&[]),
            Err(NativeError::Malformed(_))
        ));
    }

    #[test]
    fn through_the_fake_driver() {
        let mut fake = FakeDriver::new(good_response());
        fake.stray_first = true;
        let r = read_power(&mut fake, 3, Duration::from_secs(1)).unwrap();
        assert_eq!(r.current, Some(344.0));

        let mut silent = FakeDriver::new(good_response());
        silent.silent = true;
        assert!(matches!(
            read_power(&mut silent, 3, Duration::from_millis(10)),
            Err(NativeError::Timeout(_))
        ));
    }

    #[test]
    fn lan_ip() {
        let mut fake = FakeDriver::new(vec![0x00, 0x11, 10, 1, 2, 3]);
        assert_eq!(
            read_lan_ip(&mut fake, 1, 1, Duration::from_secs(1)).unwrap(),
            std::net::Ipv4Addr::new(10, 1, 2, 3)
        );
        let (_, netfn, cmd, data) = &fake.seen[0];
        assert_eq!((*netfn, *cmd), (0x0c, 0x02));
        assert_eq!(data, &[1, 3, 0, 0]);
        assert!(matches!(
            decode_lan_ip(&[0xc1]),
            Err(NativeError::Completion(0xc1))
        ));
        assert!(matches!(
            decode_lan_ip(&[0, 1, 2]),
            Err(NativeError::Malformed(_))
        ));
    }

    #[test]
    fn a_plain_file_is_not_an_ipmi_device() {
        let tmp = tempfile::NamedTempFile::new().unwrap();
        let mut dev = OpenIpmiDevice::open(tmp.path()).unwrap();
        let err = read_power(&mut dev, 1, Duration::from_millis(10)).unwrap_err();
        assert!(err.to_string().contains("not an OpenIPMI device"), "{err}");
    }

    proptest::proptest! {
        #[test]
        fn decode_never_panics(data in proptest::collection::vec(proptest::num::u8::ANY, 0..40)) {
            let _ = decode_power_response(&data);
        }
    }
}
