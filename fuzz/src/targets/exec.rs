//! Exec frames and control messages: `Frame::decode` on arbitrary bytes
//! (and its round trip), and the JSON messages of the exec and session
//! channel, from mutated seeds and from structured JSON built out of the
//! seeds' own keys and values.

use fastrand::Rng;
use serde_json::Value;
use silo_protocol::exec::{
    AgentMessage, Channel, ClientMessage, ExecSpec, Frame, StreamOffsets, WindowSize,
};
use silo_protocol::session::{SessionInfo, check_id};

use super::{Target, shape};
use crate::mutate::mutate;

/// The first input byte picks the decoder; the rest is its input.
const DECODERS: u8 = 4;
/// Deepest structured JSON value.
const MAX_DEPTH: u32 = 4;

/// The exec frame and control-message target.
pub struct Exec {
    seeds: Vec<Vec<u8>>,
    dict: Vec<Vec<u8>>,
    words: Vec<String>,
}

impl Exec {
    /// The target with its seeds.
    pub fn new() -> Self {
        let messages = [
            ClientMessage::Exec {
                tag: 1,
                spec: ExecSpec {
                    argv: vec!["sh".into(), "-c".into(), "echo hi".into()],
                    tty: true,
                    window: Some(WindowSize { rows: 24, cols: 80 }),
                    session: Some("s1".into()),
                    ..ExecSpec::default()
                },
            },
            ClientMessage::Attach {
                tag: 2,
                exec_id: 7,
                from_seq: 0,
                from_streams: Some(StreamOffsets {
                    stdout: 3,
                    stderr: 1,
                }),
            },
            ClientMessage::List { tag: 5 },
            ClientMessage::Watch {
                tag: 6,
                path: "/tmp".into(),
                recursive: true,
            },
            ClientMessage::Unwatch {
                tag: 7,
                watch_id: 1,
            },
            ClientMessage::Interrupt {
                tag: 3,
                exec_id: 7,
                grace_ms: Some(100),
            },
            ClientMessage::Resize {
                exec_id: 7,
                window: WindowSize { rows: 1, cols: 1 },
            },
            ClientMessage::SessionInterrupt {
                tag: 4,
                session: "s1".into(),
                grace_ms: None,
            },
        ];
        let mut seeds: Vec<Vec<u8>> = messages
            .iter()
            .filter_map(|m| serde_json::to_vec(m).ok())
            .collect();
        seeds.push(
            Frame {
                channel: Channel::Stdout,
                exec_id: 7,
                seq: 42,
                payload: b"out".to_vec(),
            }
            .encode(),
        );
        seeds.push(serde_json::to_vec(&SessionInfo::default()).unwrap_or_default());
        let mut words = Vec::new();
        for seed in &seeds {
            if let Ok(value) = serde_json::from_slice::<Value>(seed) {
                collect_words(&value, &mut words);
            }
        }
        words.sort();
        words.dedup();
        let dict = words
            .iter()
            .map(|w| format!("\"{w}\"").into_bytes())
            .collect();
        Self { seeds, dict, words }
    }

    fn json(&self, rng: &mut Rng, depth: u32) -> Value {
        let word = |rng: &mut Rng| self.words[rng.usize(..self.words.len())].clone();
        match rng.u8(0..8) {
            0 => Value::Null,
            1 => Value::Bool(rng.bool()),
            2 => Value::from(rng.u64(..)),
            3 => Value::from(rng.i64(..)),
            4 => Value::String(word(rng)),
            5 => Value::String(shape::<String>(rng, 16).unwrap_or_default()),
            6 if depth < MAX_DEPTH => Value::Array(
                (0..rng.usize(0..4))
                    .map(|_| self.json(rng, depth + 1))
                    .collect(),
            ),
            _ if depth < MAX_DEPTH => {
                let mut map = serde_json::Map::new();
                if rng.u8(0..4) > 0 {
                    map.insert("type".into(), Value::String(word(rng)));
                }
                for _ in 0..rng.usize(0..6) {
                    map.insert(word(rng), self.json(rng, depth + 1));
                }
                Value::Object(map)
            }
            _ => Value::Null,
        }
    }
}

impl Default for Exec {
    fn default() -> Self {
        Self::new()
    }
}

fn collect_words(value: &Value, out: &mut Vec<String>) {
    match value {
        Value::String(s) => out.push(s.clone()),
        Value::Array(items) => items.iter().for_each(|v| collect_words(v, out)),
        Value::Object(map) => {
            for (key, value) in map {
                out.push(key.clone());
                collect_words(value, out);
            }
        }
        _ => {}
    }
}

impl Target for Exec {
    fn name(&self) -> &'static str {
        "exec"
    }

    fn generate(&mut self, rng: &mut Rng) -> Vec<u8> {
        let decoder = rng.u8(0..DECODERS);
        let body = match rng.u8(0..3) {
            0 => serde_json::to_vec(&self.json(rng, 0)).unwrap_or_default(),
            1 => shape::<Vec<u8>>(rng, 64).unwrap_or_default(),
            _ => {
                let seed = &self.seeds[rng.usize(..self.seeds.len())];
                mutate(rng, seed, &self.seeds, &self.dict)
            }
        };
        let mut input = vec![decoder];
        input.extend(body);
        input
    }

    fn run(&mut self, input: &[u8]) -> Result<(), String> {
        let Some((decoder, body)) = input.split_first() else {
            return Ok(());
        };
        match decoder % DECODERS {
            0 => {
                if let Ok(frame) = Frame::decode(body) {
                    if frame.encode() != body {
                        return Err("a decoded frame does not encode to its bytes".into());
                    }
                }
            }
            1 => {
                if let Ok(message) = serde_json::from_slice::<ClientMessage>(body) {
                    round_trip(&message)?;
                }
            }
            2 => {
                if let Ok(message) = serde_json::from_slice::<AgentMessage>(body) {
                    round_trip(&message)?;
                }
            }
            _ => {
                if let Ok(info) = serde_json::from_slice::<SessionInfo>(body) {
                    let _ = check_id(&info.id);
                }
                let _ = check_id(&String::from_utf8_lossy(body));
            }
        }
        Ok(())
    }
}

/// A message that decoded must encode and decode to itself.
fn round_trip<T>(message: &T) -> Result<(), String>
where
    T: serde::Serialize + serde::de::DeserializeOwned + PartialEq,
{
    let text = serde_json::to_vec(message).map_err(|e| format!("cannot re-encode: {e}"))?;
    match serde_json::from_slice::<T>(&text) {
        Ok(again) if again == *message => Ok(()),
        _ => Err("a decoded message does not survive a round trip".into()),
    }
}
