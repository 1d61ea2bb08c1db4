#![no_main]
//! Fuzzes what an OpenStack cloud tells the stats-server: Nova's server pages (each server
//! then turned into a unit) and Keystone's user and project pages.

use libfuzzer_sys::fuzz_target;

use ceems::manager::openstack::server::{self, GpuAliases, Names, ProjectPage, ServerPage, UserPage};

fuzz_target!(|data: &[u8]| {
    if let Ok(page) = serde_json::from_slice::<ServerPage>(data) {
        let _ = page.next();
        for s in &page.servers {
            let _ = server::to_record(s, &Names::default(), &GpuAliases::All, 1_795_651_200);
        }
    }
    let _ = serde_json::from_slice::<UserPage>(data);
    let _ = serde_json::from_slice::<ProjectPage>(data);
});
