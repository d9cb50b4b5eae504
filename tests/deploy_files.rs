//! docker-compose.yml, the Prometheus config, the leafd configs it mounts and the Grafana
//! files are consistent with each other and with what leafd really accepts and exports.

use std::collections::{BTreeSet, HashSet};
use std::path::Path;

use leafd::config::{Config, CoordinatorKind};
use yaml_rust2::{Yaml, YamlLoader};

fn load_yaml(path: &str) -> Yaml {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e}"));
    YamlLoader::load_from_str(&text)
        .unwrap_or_else(|e| panic!("{path}: {e}"))
        .remove(0)
}

fn port_of(addr: &str) -> &str {
    addr.rsplit(':').next().unwrap()
}

#[test]
fn compose_services_mounts_ports_and_configs_are_consistent() {
    let compose = load_yaml("docker-compose.yml");
    let services = compose["services"].as_hash().expect("services");
    let names: BTreeSet<&str> = services.keys().filter_map(|k| k.as_str()).collect();
    assert_eq!(
        names,
        BTreeSet::from([
            "grafana",
            "leafd-1",
            "leafd-2",
            "mysql",
            "prometheus",
            "zookeeper"
        ])
    );
    assert!(Path::new("Dockerfile").is_file());

    let mut scrape_targets = HashSet::new();
    for node in ["leafd-1", "leafd-2"] {
        let service = &compose["services"][node];
        assert_eq!(
            service["build"].as_str(),
            Some("."),
            "{node} is built from the repo"
        );
        let mount = service["volumes"][0].as_str().unwrap();
        let (host, container) = mount.split_once(':').unwrap();
        assert!(container.starts_with("/etc/leafd/leafd.toml"), "{mount}");
        let config = Config::from_file(Path::new(host)).unwrap();
        leafd::app::validate_config(&config).unwrap();
        assert!(config
            .storage
            .url
            .starts_with("mysql://root:leaf@mysql:3306/leaf"));
        assert_eq!(config.snowflake.coordinator, CoordinatorKind::Zookeeper);
        assert_eq!(config.snowflake.zookeeper.connect, "zookeeper:2181");
        assert_eq!(
            config.snowflake.zookeeper.advertise.as_deref(),
            Some(&*format!("{node}:6380"))
        );
        // Published ports map to the ports leafd listens on.
        let ports: Vec<&str> = service["ports"]
            .as_vec()
            .unwrap()
            .iter()
            .map(|p| p.as_str().unwrap().rsplit(':').next().unwrap())
            .collect();
        assert_eq!(
            ports,
            vec![port_of(&config.server.bind), port_of(&config.http.bind)]
        );
        scrape_targets.insert(format!("{node}:{}", port_of(&config.http.bind)));
    }
    let mysql = &compose["services"]["mysql"]["environment"];
    assert_eq!(mysql["MYSQL_ROOT_PASSWORD"].as_str(), Some("leaf"));
    assert_eq!(mysql["MYSQL_DATABASE"].as_str(), Some("leaf"));

    // Prometheus scrapes exactly the two leafd HTTP listeners.
    let prom_mount = compose["services"]["prometheus"]["volumes"][0]
        .as_str()
        .unwrap();
    let prometheus = load_yaml(prom_mount.split(':').next().unwrap());
    let targets: HashSet<String> = prometheus["scrape_configs"][0]["static_configs"][0]["targets"]
        .as_vec()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap().to_string())
        .collect();
    assert_eq!(targets, scrape_targets);

    // Grafana's mounts exist and point at the provisioning and dashboard folders.
    for mount in compose["services"]["grafana"]["volumes"].as_vec().unwrap() {
        let host = mount.as_str().unwrap().split(':').next().unwrap();
        assert!(Path::new(host).is_dir(), "{host}");
    }
    let provider = load_yaml("grafana/provisioning/dashboards/leafd.yml");
    assert_eq!(
        provider["providers"][0]["options"]["path"].as_str(),
        Some("/var/lib/grafana/dashboards")
    );
    let datasource = load_yaml("grafana/provisioning/datasources/prometheus.yml");
    assert_eq!(
        datasource["datasources"][0]["uid"].as_str(),
        Some("prometheus")
    );
    assert_eq!(
        datasource["datasources"][0]["url"].as_str(),
        Some("http://prometheus:9090")
    );
}

#[test]
fn dashboard_queries_only_metrics_leafd_defines() {
    let dashboard: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string("grafana/dashboards/leafd.json").unwrap())
            .unwrap();
    let source = std::fs::read_to_string("src/metrics/names.rs").unwrap();
    let panels = dashboard["panels"].as_array().unwrap();
    assert!(panels.len() >= 12);
    for panel in panels {
        assert_eq!(panel["datasource"]["uid"], "prometheus");
        for target in panel["targets"].as_array().unwrap() {
            let expr = target["expr"].as_str().unwrap();
            let metrics: Vec<&str> = expr
                .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .filter(|w| w.starts_with("leafd_"))
                .collect();
            assert!(!metrics.is_empty(), "{expr}");
            for metric in metrics {
                let base = metric
                    .trim_end_matches("_bucket")
                    .trim_end_matches("_sum")
                    .trim_end_matches("_count");
                assert!(
                    source.contains(&format!("\"{base}\"")),
                    "{metric} in {expr} is not defined in src/metrics/names.rs"
                );
            }
        }
    }
}

#[test]
fn alert_rules_use_only_metrics_leafd_defines_and_are_loaded() {
    let rules = load_yaml("docker/alerts.yml");
    let source = std::fs::read_to_string("src/metrics/names.rs").unwrap();
    let mut alerts = 0;
    for group in rules["groups"].as_vec().unwrap() {
        for rule in group["rules"].as_vec().unwrap() {
            let expr = rule["expr"].as_str().unwrap();
            alerts += 1;
            for metric in expr
                .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .filter(|w| w.starts_with("leafd_"))
            {
                assert!(
                    source.contains(&format!("\"{metric}\"")),
                    "{metric} in {expr} is not defined in src/metrics/names.rs"
                );
            }
        }
    }
    assert!(alerts >= 3);
    let prometheus = load_yaml("docker/prometheus.yml");
    assert_eq!(
        prometheus["rule_files"][0].as_str(),
        Some("/etc/prometheus/alerts.yml")
    );
    let compose = std::fs::read_to_string("docker-compose.yml").unwrap();
    assert!(compose.contains("./docker/alerts.yml:/etc/prometheus/alerts.yml:ro"));
}
