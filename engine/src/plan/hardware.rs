//! The machines a plan can be made for: the table shipped as `recipes/hardware.toml`
//! (compiled in, so the binary needs no data files), `cpu` for this machine's RAM (what
//! the native engine and vLLM's CPU backend use), or a bare memory size.

use serde::Deserialize;

use crate::size::ByteSize;

/// The table, as shipped.
const TABLE: &str = include_str!("../../../recipes/hardware.toml");

/// One machine (per GPU).
#[derive(Debug, Clone, PartialEq)]
pub struct Hardware {
    /// The name it was asked for by.
    pub name: String,
    /// What it is.
    pub description: String,
    /// Memory in bytes.
    pub memory: u64,
    /// Peak memory bandwidth, GB/s, when known.
    pub bandwidth_gbs: Option<f64>,
    /// CPU and accelerator share the memory.
    pub unified: bool,
    /// FP4 tensor cores.
    pub native_fp4: bool,
    /// This machine's CPU and RAM rather than a GPU.
    pub cpu: bool,
    /// The host memory beside one GPU (per instance), bytes, when known: the table's
    /// `host_memory` (the same pool as `memory` on a unified machine), or
    /// `--host-memory`.
    pub host_memory: Option<u64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Table {
    device: Vec<Device>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Device {
    name: String,
    #[serde(default)]
    aliases: Vec<String>,
    description: String,
    memory: ByteSize,
    bandwidth_gbs: f64,
    unified: bool,
    native_fp4: bool,
    #[serde(default)]
    host_memory: Option<ByteSize>,
}

/// Why no machine could be chosen.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HardwareError {
    /// A name the table does not have.
    #[error("sous knows no GPU called `{name}`")]
    Unknown {
        /// The name.
        name: String,
        /// The names it knows.
        known: Vec<String>,
    },
    /// `cpu` where /proc/meminfo cannot be read.
    #[error("this machine's memory cannot be read (/proc/meminfo)")]
    NoMeminfo,
    /// The shipped table does not parse (a bug).
    #[error("the shipped hardware table does not parse: {0}")]
    Table(String),
}

impl crate::diagnose::Diagnose for HardwareError {
    fn class(&self) -> crate::diagnose::Class {
        match self {
            HardwareError::Table(_) => crate::diagnose::Class::Internal,
            _ => crate::diagnose::Class::User,
        }
    }

    fn hint(&self) -> Option<String> {
        match self {
            HardwareError::Unknown { name, known } => Some(
                match crate::recipe::closest(name, known.iter().map(String::as_str)) {
                    Some(near) => format!("did you mean `{near}`? Or give the memory: `--gpu-memory 48GiB`"),
                    None => format!(
                        "known: {}; or give the memory: `--gpu-memory 48GiB`",
                        known.join(", ")
                    ),
                },
            ),
            HardwareError::NoMeminfo => Some("give the memory: `--gpu-memory 64GiB`".into()),
            HardwareError::Table(_) => None,
        }
    }
}

fn table() -> Result<Vec<Device>, HardwareError> {
    toml::from_str::<Table>(TABLE)
        .map(|t| t.device)
        .map_err(|e| HardwareError::Table(e.to_string()))
}

/// The names `--gpu` accepts, `cpu` included.
pub fn names() -> Vec<String> {
    let mut names: Vec<String> = table().unwrap_or_default().into_iter().map(|d| d.name).collect();
    names.push("cpu".into());
    names
}

impl Hardware {
    /// The machine called `name` (a table name or alias, or `cpu`).
    pub fn named(name: &str) -> Result<Hardware, HardwareError> {
        let wanted = name.to_ascii_lowercase();
        if wanted == "cpu" {
            return Hardware::this_cpu();
        }
        let devices = table()?;
        let device = devices
            .into_iter()
            .find(|d| d.name == wanted || d.aliases.contains(&wanted))
            .ok_or_else(|| HardwareError::Unknown {
                name: name.to_owned(),
                known: names(),
            })?;
        Ok(Hardware {
            name: device.name,
            description: device.description,
            memory: device.memory.0,
            bandwidth_gbs: Some(device.bandwidth_gbs),
            unified: device.unified,
            native_fp4: device.native_fp4,
            cpu: false,
            host_memory: device.host_memory.map(|b| b.0),
        })
    }

    /// This machine's RAM, as the native engine and vLLM's CPU backend see it.
    pub fn this_cpu() -> Result<Hardware, HardwareError> {
        let memory = crate::host::total().ok_or(HardwareError::NoMeminfo)?;
        Ok(Hardware {
            name: "cpu".into(),
            description: "this machine's CPU and RAM".into(),
            memory,
            bandwidth_gbs: None,
            unified: true,
            native_fp4: false,
            cpu: true,
            host_memory: Some(memory),
        })
    }

    /// The GPU the driver reports (`cuda:N`, its name and total memory), with the
    /// bandwidth and features of the table's entry its name matches (`NVIDIA H100 80GB
    /// HBM3` is `h100`, `NVIDIA GB10` is `gb10`), and the driver's memory rather than
    /// the table's nominal figure.
    pub fn from_device(device: &crate::device::DeviceMemory) -> Hardware {
        let known = table().unwrap_or_default();
        let spelled = device
            .name
            .to_ascii_lowercase()
            .trim_start_matches("nvidia ")
            .replace(' ', "-");
        // The longest table name or alias the driver's name contains.
        let entry = known
            .into_iter()
            .filter_map(|d| {
                let longest = std::iter::once(&d.name)
                    .chain(&d.aliases)
                    .filter(|n| spelled.contains(n.as_str()))
                    .map(String::len)
                    .max()?;
                Some((longest, d))
            })
            .max_by_key(|(len, _)| *len)
            .map(|(_, d)| d);
        let description = match &entry {
            Some(d) => format!("{}, as the table's `{}`", device.name, d.name),
            None => format!("{}, not in sous's table", device.name),
        };
        Hardware {
            name: format!("cuda:{}", device.ordinal),
            description,
            memory: device.total_bytes,
            bandwidth_gbs: entry.as_ref().map(|d| d.bandwidth_gbs),
            unified: device.unified || entry.as_ref().is_some_and(|d| d.unified),
            native_fp4: entry.as_ref().is_some_and(|d| d.native_fp4),
            cpu: false,
            host_memory: if device.unified {
                Some(device.total_bytes)
            } else {
                entry.and_then(|d| d.host_memory.map(|b| b.0))
            },
        }
    }

    /// A GPU known only by its memory (`--gpu-memory`).
    pub fn with_memory(memory: u64) -> Hardware {
        Hardware {
            name: "gpu".into(),
            description: format!("a GPU with {}", crate::size::human(memory)),
            memory,
            bandwidth_gbs: None,
            unified: false,
            native_fp4: false,
            cpu: false,
            host_memory: None,
        }
    }

    /// The same machine with `bytes` of host memory per instance (`--host-memory`).
    pub fn with_host_memory(mut self, bytes: u64) -> Hardware {
        self.host_memory = Some(bytes);
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shipped_table_parses_and_names_resolve() {
        let spark = Hardware::named("dgx-spark").expect("alias");
        assert_eq!(spark.name, "gb10");
        assert_eq!(spark.memory, 128_000_000_000);
        assert!(spark.unified && spark.native_fp4);
        // One pool: the host memory is the GPU's.
        assert_eq!(spark.host_memory, Some(spark.memory));
        assert_eq!(Hardware::named("rtx-pro-6000").expect("card").host_memory, None);
        assert_eq!(Hardware::named("H200").expect("case").bandwidth_gbs, Some(4800.0));
        assert!(!Hardware::named("h100").expect("h100").native_fp4);
        let driver = |name: &str, unified| crate::device::DeviceMemory {
            ordinal: 0,
            name: name.into(),
            free_bytes: 1 << 30,
            total_bytes: 85_045_231_616,
            unified,
        };
        let h100 = Hardware::from_device(&driver("NVIDIA H100 80GB HBM3", false));
        assert_eq!((h100.name.as_str(), h100.bandwidth_gbs), ("cuda:0", Some(3350.0)));
        assert_eq!(
            h100.memory, 85_045_231_616,
            "the driver's figure, not the table's"
        );
        let gb10 = Hardware::from_device(&driver("NVIDIA GB10", true));
        assert!(gb10.unified && gb10.native_fp4 && gb10.host_memory == Some(gb10.memory));
        let pro = Hardware::from_device(&driver(
            "NVIDIA RTX PRO 6000 Blackwell Workstation Edition",
            false,
        ));
        assert!(
            pro.description.ends_with("as the table's `rtx-pro-6000`"),
            "{}",
            pro.description
        );
        let unknown = Hardware::from_device(&driver("NVIDIA A10", false));
        assert_eq!(unknown.bandwidth_gbs, None);
        assert!(unknown.description.ends_with("not in sous's table"));
        match Hardware::named("h300") {
            Err(HardwareError::Unknown { known, .. }) => assert!(known.contains(&"h200".to_owned())),
            other => panic!("{other:?}"),
        }
    }
}
