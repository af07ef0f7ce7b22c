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
        match Hardware::named("h300") {
            Err(HardwareError::Unknown { known, .. }) => assert!(known.contains(&"h200".to_owned())),
            other => panic!("{other:?}"),
        }
    }
}
