//! Overhead benchmark; filled in below.
use anyhow::Result;

pub fn run(_rounds: u32, _seconds: u32) -> Result<()> {
    anyhow::bail!("not written yet")
}
