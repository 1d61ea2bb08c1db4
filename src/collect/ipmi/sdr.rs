//! The BMC's sensors read natively: the Sensor Data Repository's full sensor records (IPMI
//! v2.0 §43.1) say what each sensor is and how its raw byte becomes a value (§36.3); Get
//! Sensor Reading (§35.14) gives that byte. Everything that decodes BMC bytes returns an
//! error or `None` on short or odd input, never panics.

use std::os::raw::c_long;
use std::time::Duration;

use super::native::{exchange, IpmiDriver, NativeError};
use super::sensors::{unit_symbol, SensorReading};

/// Storage network function (SDR repository).
pub const NETFN_STORAGE: u8 = 0x0a;
/// "Reserve SDR Repository".
pub const CMD_RESERVE_SDR: u8 = 0x22;
/// "Get SDR".
pub const CMD_GET_SDR: u8 = 0x23;
/// Sensor/event network function.
pub const NETFN_SENSOR: u8 = 0x04;
/// "Get Sensor Reading".
pub const CMD_GET_SENSOR_READING: u8 = 0x2d;

/// The record type of a full sensor record, the only kind with conversion factors.
const RECORD_TYPE_FULL: u8 = 0x01;
/// The SDR header: record id (2), version, type, length of what follows.
const HEADER_LEN: usize = 5;
/// What every BMC returns in one Get SDR; many refuse more (completion code 0xca).
const CHUNK: u8 = 16;
/// The BMC's own address: sensors owned by another controller need bridging, not done here.
const BMC_ADDRESS: u8 = 0x20;
/// More records than any BMC holds: a repository whose "next" ids loop stops here.
const MAX_RECORDS: usize = 1024;
/// Completion code "reservation cancelled": the repository changed while it was read.
const CC_RESERVATION_CANCELLED: u8 = 0xc5;
/// Completion code "requested sensor, data or record not present".
const CC_NOT_PRESENT: u8 = 0xcb;

/// How a raw reading is signed (Sensor Units 1, bits 7:6).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AnalogFormat {
    Unsigned,
    OnesComplement,
    TwosComplement,
    /// The sensor gives no numeric reading.
    None,
}

/// One full sensor record, as far as a reading needs it.
#[derive(Debug, Clone, PartialEq)]
pub struct SensorRecord {
    pub number: u8,
    pub owner: u8,
    pub lun: u8,
    pub name: String,
    /// Sensor Units 2: the base unit's code (§43.17).
    pub unit: u8,
    pub format: AnalogFormat,
    /// The linear formula's M, B, B's exponent (K1) and the result's exponent (K2).
    pub m: i16,
    pub b: i16,
    pub b_exp: i8,
    pub r_exp: i8,
    /// 0 linear, 1-11 one of the spec's formulas, 0x70 and above non-linear.
    pub linearization: u8,
}

/// Sign-extends the low `bits` bits of `value`.
fn signed(value: u16, bits: u32) -> i16 {
    let shift = 16 - bits;
    ((value << shift) as i16) >> shift
}

/// Decodes an ID string of `len` characters in the SDR's encoding (§43.15).
fn id_string(kind: u8, len: usize, bytes: &[u8]) -> Result<String, String> {
    let take = |n: usize| {
        bytes
            .get(..n)
            .ok_or_else(|| format!("ID string of {n} bytes, {} present", bytes.len()))
    };
    let text: String = match kind {
        // Unicode (which BMCs use as plain bytes) and 8-bit ASCII + Latin-1.
        0 | 3 => take(len)?.iter().map(|&b| char::from(b)).collect(),
        // BCD plus: two characters a byte, high nibble first.
        1 => {
            const DIGITS: &[u8; 16] = b"0123456789 -.:,_";
            let raw = take(len.div_ceil(2))?;
            (0..len)
                .map(|i| {
                    let byte = raw[i / 2];
                    let nibble = if i % 2 == 0 { byte >> 4 } else { byte & 0xf };
                    char::from(DIGITS[usize::from(nibble)])
                })
                .collect()
        }
        // 6-bit packed ASCII: four characters in three bytes, least significant bits first.
        _ => {
            let raw = take((len * 6).div_ceil(8))?;
            (0..len)
                .map(|i| {
                    let bit = i * 6;
                    let pair = u16::from(raw[bit / 8])
                        | raw.get(bit / 8 + 1).map_or(0, |&b| u16::from(b) << 8);
                    char::from(((pair >> (bit % 8)) & 0x3f) as u8 + 0x20)
                })
                .collect()
        }
    };
    Ok(text.trim_end_matches(['\0', ' ']).to_owned())
}

/// Decodes one SDR (header first). `Ok(None)` for a record that is not a full sensor record.
pub fn decode_record(record: &[u8]) -> Result<Option<SensorRecord>, String> {
    let Some(&kind) = record.get(3) else {
        return Err(format!(
            "SDR of {} bytes, shorter than its header",
            record.len()
        ));
    };
    if kind != RECORD_TYPE_FULL {
        return Ok(None);
    }
    // Bytes are numbered as in the spec's table 43-1, from 1.
    let byte = |n: usize| record.get(n - 1).copied();
    let Some(type_length) = byte(48) else {
        return Err(format!(
            "full sensor record of {} bytes, expected at least 48",
            record.len()
        ));
    };
    let [owner, lun, number, units1, unit, linearization, m_lo, m_hi, b_lo, b_hi, exps] =
        [6, 7, 8, 21, 22, 24, 25, 26, 27, 28, 30].map(|n| byte(n).unwrap_or(0));
    let format = match units1 >> 6 {
        0 => AnalogFormat::Unsigned,
        1 => AnalogFormat::OnesComplement,
        2 => AnalogFormat::TwosComplement,
        _ => AnalogFormat::None,
    };
    let name = id_string(
        type_length >> 6,
        usize::from(type_length & 0x1f),
        record.get(48..).unwrap_or_default(),
    )?;
    Ok(Some(SensorRecord {
        number,
        owner,
        lun: lun & 0x3,
        name,
        unit,
        format,
        m: signed(u16::from(m_lo) | u16::from(m_hi >> 6) << 8, 10),
        b: signed(u16::from(b_lo) | u16::from(b_hi >> 6) << 8, 10),
        r_exp: signed(u16::from(exps >> 4), 4) as i8,
        b_exp: signed(u16::from(exps & 0xf), 4) as i8,
        linearization: linearization & 0x7f,
    }))
}

impl SensorRecord {
    /// The value of a raw reading: y = L[(M·x + B·10^K1)·10^K2]. `None` where the sensor
    /// gives no numeric reading or needs per-reading factors (non-linear).
    pub fn convert(&self, raw: u8) -> Option<f64> {
        let x = match self.format {
            AnalogFormat::Unsigned => f64::from(raw),
            AnalogFormat::OnesComplement if raw & 0x80 != 0 => -f64::from(!raw),
            AnalogFormat::OnesComplement => f64::from(raw),
            AnalogFormat::TwosComplement => f64::from(raw as i8),
            AnalogFormat::None => return None,
        };
        let linear = (f64::from(self.m) * x
            + f64::from(self.b) * 10f64.powi(i32::from(self.b_exp)))
            * 10f64.powi(i32::from(self.r_exp));
        let y = match self.linearization {
            0 => linear,
            1 => linear.ln(),
            2 => linear.log10(),
            3 => linear.log2(),
            4 => linear.exp(),
            5 => 10f64.powf(linear),
            6 => linear.exp2(),
            7 => linear.recip(),
            8 => linear * linear,
            9 => linear * linear * linear,
            10 => linear.sqrt(),
            11 => linear.cbrt(),
            _ => return None,
        };
        y.is_finite().then_some(y)
    }

    /// Whether this process can read it: owned by the BMC itself, with a numeric reading.
    pub fn readable(&self) -> bool {
        self.owner == BMC_ADDRESS
            && self.lun == 0
            && self.format != AnalogFormat::None
            && self.linearization <= 11
    }
}

/// Decodes a Get Sensor Reading answer (completion code first). `Ok(None)` when the BMC
/// says the sensor is absent, not scanning, or its reading unavailable.
pub fn decode_reading(record: &SensorRecord, data: &[u8]) -> Result<Option<f64>, NativeError> {
    match data {
        [CC_NOT_PRESENT, ..] => Ok(None),
        [0, raw, flags, ..] => {
            // Bit 6: scanning enabled; bit 5: reading unavailable.
            if flags & 0x40 == 0 || flags & 0x20 != 0 {
                return Ok(None);
            }
            Ok(record.convert(*raw))
        }
        [0, ..] => Err(NativeError::Malformed(format!(
            "sensor reading of {} bytes, expected 3",
            data.len()
        ))),
        [code, ..] => Err(NativeError::Completion(*code)),
        [] => Err(NativeError::Malformed("empty response".into())),
    }
}

/// A BMC conversation: one driver, one message id sequence, one timeout.
pub struct Session<'a> {
    pub driver: &'a mut dyn IpmiDriver,
    pub msgid: c_long,
    pub timeout: Duration,
}

impl Session<'_> {
    fn ask(&mut self, netfn: u8, cmd: u8, data: &[u8]) -> Result<Vec<u8>, NativeError> {
        self.msgid = self.msgid.wrapping_add(1);
        exchange(self.driver, self.msgid, netfn, cmd, data, self.timeout)
    }

    /// A reservation id; 0 (which BMCs take for whole-record reads) if none is given.
    fn reserve(&mut self) -> Result<[u8; 2], NativeError> {
        match self.ask(NETFN_STORAGE, CMD_RESERVE_SDR, &[])?.as_slice() {
            [0, lo, hi, ..] => Ok([*lo, *hi]),
            _ => Ok([0, 0]),
        }
    }

    /// One Get SDR: the next record's id and the bytes asked for.
    fn get_sdr(
        &mut self,
        reservation: [u8; 2],
        id: u16,
        offset: u8,
        count: u8,
    ) -> Result<(u16, Vec<u8>), NativeError> {
        let [id_lo, id_hi] = id.to_le_bytes();
        let data = self.ask(
            NETFN_STORAGE,
            CMD_GET_SDR,
            &[reservation[0], reservation[1], id_lo, id_hi, offset, count],
        )?;
        match data.as_slice() {
            [0, lo, hi, rest @ ..] => Ok((u16::from_le_bytes([*lo, *hi]), rest.to_vec())),
            [0, ..] => Err(NativeError::Malformed(format!(
                "Get SDR answer of {} bytes",
                data.len()
            ))),
            [code, ..] => Err(NativeError::Completion(*code)),
            [] => Err(NativeError::Malformed("empty response".into())),
        }
    }

    /// One whole record, read in chunks: its header, then its body.
    fn read_record(
        &mut self,
        reservation: [u8; 2],
        id: u16,
    ) -> Result<(u16, Vec<u8>), NativeError> {
        let (next, header) = self.get_sdr(reservation, id, 0, HEADER_LEN as u8)?;
        if header.len() < HEADER_LEN {
            return Err(NativeError::Malformed(format!(
                "SDR {id:#06x}: header of {} bytes",
                header.len()
            )));
        }
        let total = HEADER_LEN + usize::from(header[4]);
        let mut record = header;
        record.truncate(HEADER_LEN);
        while record.len() < total {
            let want = (total - record.len()).min(usize::from(CHUNK)) as u8;
            // Get SDR's offset is one byte: a record longer than that cannot be read whole.
            let offset = u8::try_from(record.len()).map_err(|_| {
                NativeError::Malformed(format!(
                    "SDR {id:#06x}: {total} bytes, more than one offset reaches"
                ))
            })?;
            let (_, part) = self.get_sdr(reservation, id, offset, want)?;
            if part.is_empty() {
                return Err(NativeError::Malformed(format!(
                    "SDR {id:#06x}: no bytes at offset {}",
                    record.len()
                )));
            }
            record.extend_from_slice(&part[..part.len().min(usize::from(want))]);
        }
        Ok((next, record))
    }

    /// Every full sensor record of the repository, in its order.
    pub fn sensor_records(&mut self) -> Result<Vec<SensorRecord>, NativeError> {
        let mut reservation = self.reserve()?;
        let mut records = Vec::new();
        let mut id = 0u16;
        let mut seen = std::collections::HashSet::new();
        let mut retries = 0;
        while id != 0xffff && seen.len() < MAX_RECORDS && seen.insert(id) {
            let (next, bytes) = match self.read_record(reservation, id) {
                Ok(r) => r,
                Err(NativeError::Completion(CC_RESERVATION_CANCELLED)) if retries < 3 => {
                    retries += 1;
                    seen.remove(&id);
                    reservation = self.reserve()?;
                    continue;
                }
                Err(e) => return Err(e),
            };
            match decode_record(&bytes) {
                Ok(Some(r)) => records.push(r),
                Ok(None) => {}
                Err(e) => tracing::debug!(record = id, error = %e, "SDR record skipped"),
            }
            id = next;
        }
        Ok(records)
    }

    /// The current readings of `records`; an absent or unreadable sensor has no value.
    pub fn readings(
        &mut self,
        records: &[SensorRecord],
    ) -> Result<Vec<SensorReading>, NativeError> {
        records
            .iter()
            .map(|r| {
                let data = self.ask(NETFN_SENSOR, CMD_GET_SENSOR_READING, &[r.number])?;
                // A refusal for one sensor leaves it without a value; the others are read.
                let value = match decode_reading(r, &data) {
                    Err(NativeError::Completion(code)) => {
                        tracing::debug!(sensor = %r.name, code, "sensor reading refused");
                        None
                    }
                    other => other?,
                };
                Ok(SensorReading {
                    name: r.name.clone(),
                    number: Some(r.number),
                    unit: unit_symbol(r.unit).to_owned(),
                    value,
                })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::collect::ipmi::native::FnDriver;

    /// Records as Debian's `ipmi_sim` serves them (its emulator file in tests/ipmi_tools.rs).
    const CPU_TEMP: &[u8] = &[
        0x01, 0x00, 0x51, 0x01, 0x33, 0x20, 0x00, 0x30, 0x03, 0x01, 0x7f, 0x68, 0x01, 0x01, 0x95,
        0x7a, 0x95, 0x7a, 0x3f, 0x3f, 0x00, 0x01, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0xff, 0x00, 0x5f, 0x5a, 0x55, 0x00, 0x05, 0x0a, 0x00, 0x00, 0x00,
        0x00, 0x00, 0xc8, b'C', b'P', b'U', b' ', b'T', b'e', b'm', b'p',
    ];
    /// 1.22 V from a raw 61: M = 2, result exponent -2.
    const VOLTS: &[u8] = &[
        0x03, 0x00, 0x51, 0x01, 0x2e, 0x20, 0x00, 0x32, 0x03, 0x01, 0x7f, 0x68, 0x02, 0x01, 0x95,
        0x7a, 0x95, 0x7a, 0x3f, 0x3f, 0x00, 0x04, 0x00, 0x00, 0x02, 0x00, 0x00, 0x00, 0x00, 0xe0,
        0x00, 0x00, 0x00, 0x00, 0xff, 0x00, 0xc8, 0xb4, 0xaa, 0x00, 0x32, 0x3c, 0x00, 0x00, 0x00,
        0x00, 0x00, 0xc3, b'1', b'2', b'V',
    ];

    #[test]
    fn full_records_as_a_bmc_serves_them() {
        let temp = decode_record(CPU_TEMP).unwrap().unwrap();
        assert_eq!(
            (temp.number, temp.unit, temp.name.as_str()),
            (0x30, 1, "CPU Temp")
        );
        assert!(temp.readable());
        assert_eq!(temp.convert(45), Some(45.0));
        let volts = decode_record(VOLTS).unwrap().unwrap();
        assert_eq!((volts.m, volts.r_exp), (2, -2));
        assert!((volts.convert(61).unwrap() - 1.22).abs() < 1e-9);
    }

    #[test]
    fn signs_exponents_and_formats() {
        let mut bytes = CPU_TEMP.to_vec();
        // M = -1 (10-bit two's complement), B = 5 with K1 = 1, K2 = -1, two's complement raw.
        bytes[24] = 0xff;
        bytes[25] = 0xc0;
        bytes[26] = 5;
        bytes[27] = 0;
        bytes[29] = 0xf1;
        bytes[20] = 0x80;
        let r = decode_record(&bytes).unwrap().unwrap();
        assert_eq!((r.m, r.b, r.b_exp, r.r_exp), (-1, 5, 1, -1));
        assert_eq!(r.format, AnalogFormat::TwosComplement);
        // (-1 · -6 + 5 · 10) · 0.1 = 5.6
        assert!((r.convert(0xfa).unwrap() - 5.6).abs() < 1e-9);
        bytes[20] = 0x40;
        let ones = decode_record(&bytes).unwrap().unwrap();
        // One's complement 0xfa is -5: (5 + 50) · 0.1 = 5.5
        assert!((ones.convert(0xfa).unwrap() - 5.5).abs() < 1e-9);
        bytes[20] = 0xc0;
        let none = decode_record(&bytes).unwrap().unwrap();
        assert_eq!(none.convert(1), None);
        assert!(!none.readable());
    }

    #[test]
    fn id_strings_in_every_encoding() {
        assert_eq!(id_string(3, 4, b"Fan1\0\0").unwrap(), "Fan1");
        // BCD plus: "12.5" is 0x12 0xc5.
        assert_eq!(id_string(1, 4, &[0x12, 0xc5]).unwrap(), "12.5");
        // 6-bit packed "FAN1": codes 0x26 0x21 0x2e 0x11, least significant bits first.
        let codes = [0x26u32, 0x21, 0x2e, 0x11];
        let packed = codes
            .iter()
            .enumerate()
            .fold(0u32, |acc, (i, c)| acc | c << (6 * i));
        assert_eq!(id_string(2, 4, &packed.to_le_bytes()[..3]).unwrap(), "FAN1");
        assert!(id_string(3, 8, b"abc").is_err());
    }

    #[test]
    fn short_odd_and_other_records() {
        assert!(decode_record(&[]).is_err());
        assert!(decode_record(&CPU_TEMP[..30]).is_err());
        let mut compact = CPU_TEMP.to_vec();
        compact[3] = 0x02;
        assert_eq!(decode_record(&compact).unwrap(), None);
    }

    #[test]
    fn readings_absent_disabled_and_refused() {
        let temp = decode_record(CPU_TEMP).unwrap().unwrap();
        assert_eq!(
            decode_reading(&temp, &[0, 45, 0xc0, 0]).unwrap(),
            Some(45.0)
        );
        assert_eq!(
            decode_reading(&temp, &[0, 45, 0xe0, 0]).unwrap(),
            None,
            "unavailable"
        );
        assert_eq!(
            decode_reading(&temp, &[0, 45, 0x80, 0]).unwrap(),
            None,
            "not scanning"
        );
        assert_eq!(decode_reading(&temp, &[0xcb]).unwrap(), None);
        assert!(matches!(
            decode_reading(&temp, &[0xc1]),
            Err(NativeError::Completion(0xc1))
        ));
        assert!(matches!(
            decode_reading(&temp, &[0, 1]),
            Err(NativeError::Malformed(_))
        ));
    }

    /// A BMC serving `records` as ipmi_sim does: at most 16 bytes a Get SDR (0xca beyond),
    /// 0xcc for a sensor it does not have, and one cancelled reservation.
    fn fake_bmc(records: Vec<Vec<u8>>) -> impl FnMut(u8, u8, &[u8]) -> Vec<u8> {
        let mut cancel_once = true;
        let mut reservation = 0u8;
        move |netfn, cmd, data| match (netfn, cmd, data) {
            (NETFN_STORAGE, CMD_RESERVE_SDR, []) => {
                reservation += 1;
                vec![0, reservation, 0]
            }
            (NETFN_STORAGE, CMD_GET_SDR, [res, _, id, _, offset, count]) => {
                if *offset > 0 && cancel_once {
                    cancel_once = false;
                    return vec![CC_RESERVATION_CANCELLED];
                }
                if *count > 16 {
                    return vec![0xca];
                }
                if *offset > 0 && *res != reservation {
                    return vec![CC_RESERVATION_CANCELLED];
                }
                let index = if *id == 0 { 0 } else { usize::from(*id) - 1 };
                let Some(record) = records.get(index) else {
                    return vec![CC_NOT_PRESENT];
                };
                let next = if index + 1 == records.len() {
                    0xffff
                } else {
                    index as u16 + 2
                };
                let start = usize::from(*offset).min(record.len());
                let end = (start + usize::from(*count)).min(record.len());
                let mut answer = vec![0];
                answer.extend_from_slice(&next.to_le_bytes());
                answer.extend_from_slice(&record[start..end]);
                answer
            }
            (NETFN_SENSOR, CMD_GET_SENSOR_READING, [0x30]) => vec![0, 92, 0xc0, 0x18],
            (NETFN_SENSOR, CMD_GET_SENSOR_READING, [0x32]) => vec![0, 61, 0xc0, 0],
            (NETFN_SENSOR, CMD_GET_SENSOR_READING, _) => vec![0xcc],
            _ => vec![0xc1],
        }
    }

    #[test]
    fn a_repository_read_in_chunks_then_its_sensors() {
        let mut absent = CPU_TEMP.to_vec();
        absent[7] = 0x34;
        let mut driver = FnDriver::new(fake_bmc(vec![CPU_TEMP.to_vec(), VOLTS.to_vec(), absent]));
        let mut session = Session {
            driver: &mut driver,
            msgid: 0,
            timeout: Duration::from_secs(1),
        };
        let records = session.sensor_records().unwrap();
        let numbers: Vec<u8> = records.iter().map(|r| r.number).collect();
        assert_eq!(numbers, [0x30, 0x32, 0x34]);
        let readings = session.readings(&records).unwrap();
        let values: Vec<(&str, &str, Option<f64>)> = readings
            .iter()
            .map(|r| {
                (
                    r.name.as_str(),
                    r.unit.as_str(),
                    r.value.map(|v| (v * 100.0).round() / 100.0),
                )
            })
            .collect();
        assert_eq!(
            values,
            [
                ("CPU Temp", "C", Some(92.0)),
                ("12V", "V", Some(1.22)),
                ("CPU Temp", "C", None)
            ]
        );
    }

    proptest::proptest! {
        #[test]
        fn decoders_never_panic(
            record in proptest::collection::vec(proptest::num::u8::ANY, 0..80),
            reading in proptest::collection::vec(proptest::num::u8::ANY, 0..6),
        ) {
            if let Ok(Some(r)) = decode_record(&record) {
                let _ = decode_reading(&r, &reading);
                let _ = r.convert(reading.first().copied().unwrap_or(0));
            }
        }
    }
}
