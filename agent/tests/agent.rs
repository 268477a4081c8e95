//! Black-box checks of the built agent binary on a temporary Unix socket,
//! speaking the wire protocol directly (hyper for plain HTTP, tungstenite for
//! the exec channel). The full end-to-end suite lives in the workspace's
//! `tests/` crate; these only guard the agent's own contract.
#![allow(
    clippy::unwrap_used,
    reason = "test helpers: a failed step should abort the test with its error"
)]

mod common;

use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;
use silo_protocol::PROTOCOL_VERSION;
use silo_protocol::auth::{EMPTY_BODY_SHA256, sign};
use silo_protocol::exec::{
    AgentMessage, Channel, ClientMessage, ExecSpec, ExecState, ExitInfo, Frame, StreamOffsets,
};
use silo_protocol::health::Health;
use silo_protocol::http::{DeadlineState, HEADER_PROTOCOL, PATH_DEADLINE, PATH_EXEC, PATH_HEALTHZ};
use tokio::net::UnixStream;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::client::ClientRequestBuilder;
use tokio_tungstenite::tungstenite::{self, Message};

use common::{Agent, WAIT};

type Ws = WebSocketStream<UnixStream>;

impl Agent {
    async fn healthz(&self) -> (u16, Bytes) {
        let stream = UnixStream::connect(self.socket()).await.unwrap();
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .unwrap();
        tokio::spawn(conn);
        let req = http::Request::get(PATH_HEALTHZ)
            .header("host", "agent")
            .body(Empty::<Bytes>::new())
            .unwrap();
        let resp = sender.send_request(req).await.unwrap();
        let status = resp.status().as_u16();
        (status, resp.into_body().collect().await.unwrap().to_bytes())
    }

    /// Opens the exec channel; `sign` false sends no signature, `version` overrides ours.
    async fn connect(
        &self,
        sign_it: bool,
        version: Option<&str>,
    ) -> Result<Ws, tungstenite::Error> {
        let stream = UnixStream::connect(self.socket()).await.unwrap();
        let ours = PROTOCOL_VERSION.to_string();
        let mut req = ClientRequestBuilder::new(format!("ws://agent{PATH_EXEC}").parse().unwrap())
            .with_header(HEADER_PROTOCOL, version.unwrap_or(&ours));
        if sign_it {
            for (name, value) in sign(&self.key, "GET", PATH_EXEC, EMPTY_BODY_SHA256)
                .unwrap()
                .pairs()
            {
                req = req.with_header(name, value);
            }
        }
        Ok(tokio_tungstenite::client_async(req, stream).await?.0)
    }

    async fn ws(&self) -> Ws {
        self.connect(true, None).await.unwrap()
    }

    /// A signed request that must succeed, its JSON answer parsed.
    async fn json<T: serde::de::DeserializeOwned>(
        &self,
        method: &str,
        path: &str,
        body: &[u8],
    ) -> T {
        let (status, bytes) = self.call(method, path, body, true).await;
        assert_eq!(status, 200, "{}", String::from_utf8_lossy(&bytes));
        serde_json::from_slice(&bytes).unwrap()
    }

    /// The agent's exit code, once it exits within `limit`.
    fn wait_exit(&mut self, limit: Duration) -> Option<i32> {
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status.code();
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        None
    }
}

/// What came down the channel, decoded.
#[derive(Debug)]
enum In {
    Msg(AgentMessage),
    Out(Frame),
}

async fn send(ws: &mut Ws, msg: &ClientMessage) {
    ws.send(Message::text(serde_json::to_string(msg).unwrap()))
        .await
        .unwrap();
}

async fn next(ws: &mut Ws) -> In {
    loop {
        let msg = tokio::time::timeout(WAIT, ws.next())
            .await
            .expect("agent went quiet")
            .expect("channel closed")
            .unwrap();
        match msg {
            Message::Text(text) => return In::Msg(serde_json::from_str(&text).unwrap()),
            Message::Binary(bytes) => return In::Out(Frame::decode(&bytes).unwrap()),
            _ => {}
        }
    }
}

async fn exec(ws: &mut Ws, tag: u64, spec: ExecSpec) -> u64 {
    send(ws, &ClientMessage::Exec { tag, spec }).await;
    match next(ws).await {
        In::Msg(AgentMessage::Started {
            tag: t, exec_id, ..
        }) if t == tag => exec_id,
        other => panic!("expected started, got {other:?}"),
    }
}

/// Collects stdout+stderr of one exec until its exit.
async fn until_exit(ws: &mut Ws, exec_id: u64) -> (String, ExitInfo) {
    let mut out = Vec::new();
    loop {
        match next(ws).await {
            In::Out(frame) if frame.exec_id == exec_id => {
                assert_eq!(frame.seq, out.len() as u64, "frames are contiguous");
                out.extend_from_slice(&frame.payload);
            }
            In::Msg(AgentMessage::Exit { exec_id: id, exit }) if id == exec_id => {
                return (String::from_utf8_lossy(&out).into_owned(), exit);
            }
            _ => {}
        }
    }
}

fn argv(args: &[&str]) -> ExecSpec {
    ExecSpec {
        argv: args.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    }
}

#[tokio::test]
async fn smoke_healthz_exec_and_rejections() {
    let agent = Agent::start("smoke", &[]);
    let (status, body) = agent.healthz().await;
    assert_eq!(status, 200);
    let health: Health = serde_json::from_slice(&body).unwrap();
    assert_eq!(health.protocol_version, PROTOCOL_VERSION);

    let mut ws = agent.ws().await;
    let id = exec(&mut ws, 1, argv(&["echo", "hi"])).await;
    let (out, exit) = until_exit(&mut ws, id).await;
    assert_eq!(out, "hi\n");
    assert_eq!(exit.code, Some(0));
    assert_eq!(exit.output_bytes, 3);

    // The key never reaches commands; the marker does.
    let id = exec(&mut ws, 2, argv(&["env"])).await;
    let (env, _) = until_exit(&mut ws, id).await;
    assert!(!env.contains("SILO_AGENT_KEY"), "{env}");
    assert!(env.contains(&format!("SILO_EXEC_ID={id}")), "{env}");

    // Bad input gets an error and the connection stays usable.
    ws.send(Message::text(r#"{"type":"exec","tag":9}"#))
        .await
        .unwrap();
    match next(&mut ws).await {
        In::Msg(AgentMessage::Error { tag: Some(9), .. }) => {}
        other => panic!("expected error, got {other:?}"),
    }
    let id = exec(&mut ws, 3, argv(&["sh", "-c", "echo oops >&2; exit 3"])).await;
    let (out, exit) = until_exit(&mut ws, id).await;
    assert_eq!((out.as_str(), exit.code), ("oops\n", Some(3)));
    send(
        &mut ws,
        &ClientMessage::Exec {
            tag: 4,
            spec: argv(&["/no/such/program"]),
        },
    )
    .await;
    assert!(matches!(
        next(&mut ws).await,
        In::Msg(AgentMessage::Error { tag: Some(4), .. })
    ));

    match agent.connect(false, None).await {
        Err(tungstenite::Error::Http(resp)) => {
            assert_eq!(resp.status(), 401);
            let body =
                String::from_utf8_lossy(resp.body().as_deref().unwrap_or_default()).into_owned();
            assert!(body.contains("unauthorized"), "{body}");
            assert!(!body.contains(&agent.key.to_hex()));
        }
        other => panic!("expected 401, got {:?}", other.map(|_| ())),
    }
    match agent.connect(true, Some("999")).await {
        Err(tungstenite::Error::Http(resp)) => assert_eq!(resp.status(), 400),
        other => panic!("expected 400, got {:?}", other.map(|_| ())),
    }
}

#[tokio::test]
async fn interrupt_stops_sleep_promptly_and_reattach_replays() {
    let agent = Agent::start("interrupt", &[]);
    let mut ws = agent.ws().await;
    let id = exec(&mut ws, 1, argv(&["sleep", "100"])).await;
    let asked = Instant::now();
    send(
        &mut ws,
        &ClientMessage::Interrupt {
            tag: 2,
            exec_id: id,
            grace_ms: None,
        },
    )
    .await;
    let (_, exit) = until_exit(&mut ws, id).await;
    let took = asked.elapsed();
    assert!(exit.interrupted && exit.signal == Some(2), "{exit:?}");
    assert!(took < Duration::from_secs(1), "interrupt took {took:?}");

    // Output survives the connection that started it.
    let script = "echo one; sleep 0.3; echo two";
    let id = exec(&mut ws, 3, argv(&["sh", "-c", script])).await;
    drop(ws);
    let mut ws = agent.ws().await;
    send(
        &mut ws,
        &ClientMessage::Attach {
            tag: 4,
            exec_id: id,
            from_seq: 0,
            from_streams: None,
        },
    )
    .await;
    match next(&mut ws).await {
        In::Msg(AgentMessage::Attached {
            next_seq: 0,
            lost_bytes: 0,
            ..
        }) => {}
        other => panic!("expected attached, got {other:?}"),
    }
    let (out, exit) = until_exit(&mut ws, id).await;
    assert_eq!((out.as_str(), exit.code), ("one\ntwo\n", Some(0)));

    // A finished exec replays from any offset, then reports its exit at once.
    send(
        &mut ws,
        &ClientMessage::Attach {
            tag: 5,
            exec_id: id,
            from_seq: 5,
            from_streams: None,
        },
    )
    .await;
    assert!(matches!(
        next(&mut ws).await,
        In::Msg(AgentMessage::Attached { next_seq: 5, .. })
    ));
    match next(&mut ws).await {
        In::Out(frame) => assert_eq!((frame.seq, frame.payload.as_slice()), (5, &b"wo\n"[..])),
        other => panic!("expected a frame, got {other:?}"),
    }
    assert!(matches!(
        next(&mut ws).await,
        In::Msg(AgentMessage::Exit { .. })
    ));
    send(
        &mut ws,
        &ClientMessage::Interrupt {
            tag: 6,
            exec_id: id,
            grace_ms: None,
        },
    )
    .await;
    match next(&mut ws).await {
        In::Msg(AgentMessage::InterruptAck { state, .. }) => {
            assert_eq!(state, silo_protocol::exec::ExecState::Finished);
        }
        other => panic!("expected ack, got {other:?}"),
    }
}

#[tokio::test]
async fn timeouts_fire_and_background_children_do_not_hold_the_exit() {
    let agent = Agent::start("timeout", &[]);
    let mut ws = agent.ws().await;
    let spec = ExecSpec {
        timeout_ms: Some(100),
        grace_ms: Some(100),
        // Ignores SIGINT, so only the SIGKILL after the grace ends it.
        ..argv(&["sh", "-c", "trap '' INT; sleep 100"])
    };
    let id = exec(&mut ws, 1, spec).await;
    let (_, exit) = until_exit(&mut ws, id).await;
    assert!(exit.timed_out && !exit.interrupted, "{exit:?}");
    assert_eq!(exit.signal, Some(9));

    // The background sleep keeps stdout open; the exit still comes after a short linger.
    let started = Instant::now();
    let id = exec(&mut ws, 2, argv(&["sh", "-c", "sleep 5 & echo hi"])).await;
    let (out, exit) = until_exit(&mut ws, id).await;
    assert_eq!((out.as_str(), exit.code), ("hi\n", Some(0)));
    assert!(started.elapsed() < Duration::from_secs(2));
    // Interrupting the lingering remains is harmless once it has finished.
    send(
        &mut ws,
        &ClientMessage::Interrupt {
            tag: 3,
            exec_id: id,
            grace_ms: Some(0),
        },
    )
    .await;
    assert!(matches!(
        next(&mut ws).await,
        In::Msg(AgentMessage::InterruptAck { .. })
    ));
}

#[tokio::test]
async fn stdin_is_fed_and_closed_on_request() {
    let agent = Agent::start("stdin", &[]);
    let mut ws = agent.ws().await;
    let spec = ExecSpec {
        stdin: true,
        ..argv(&["cat"])
    };
    let id = exec(&mut ws, 1, spec).await;
    let frame = Frame {
        channel: Channel::Stdin,
        exec_id: id,
        seq: 0,
        payload: b"fed\n".to_vec(),
    };
    ws.send(Message::binary(frame.encode())).await.unwrap();
    send(&mut ws, &ClientMessage::CloseStdin { exec_id: id }).await;
    let (out, exit) = until_exit(&mut ws, id).await;
    assert_eq!((out.as_str(), exit.code), ("fed\n", Some(0)));

    // Without `stdin: true` the command reads EOF at once instead of hanging.
    let id = exec(&mut ws, 2, argv(&["cat"])).await;
    let (out, exit) = until_exit(&mut ws, id).await;
    assert_eq!((out.as_str(), exit.code), ("", Some(0)));
}

#[tokio::test]
async fn sigterm_stops_the_workload_and_exits_with_its_status() {
    let mut agent = Agent::start("workload", &["--", "sleep", "100"]);
    let status = agent.terminate();
    // `sleep` dies of the forwarded SIGTERM: 128 + 15.
    assert_eq!(status.code(), Some(143));

    let mut bare = Agent::start("bare", &[]);
    assert_eq!(bare.terminate().code(), Some(0));
}

#[tokio::test]
async fn a_removed_key_file_is_gone_and_an_unremovable_one_stops_the_agent() {
    let scratch = tempfile::tempdir().unwrap();
    let key_file = scratch.path().join("agent.key");
    let key = silo_protocol::auth::Key::generate().unwrap();
    std::fs::write(&key_file, key.to_hex()).unwrap();
    let file_arg = key_file.to_str().unwrap();
    let mut agent = Agent::start("layers-key", &["--key-file", file_arg, "--remove-key-file"]);
    assert!(!key_file.exists());
    // The environment's key (the harness's) lost to the file's.
    agent.key = key;
    let (status, _) = agent.healthz().await;
    assert_eq!(status, 200);
    // Signed with the file's key: the agent took it.
    let stat =
        silo_protocol::files::FileQuery::new("/").path_and_query(silo_protocol::files::PATH_STAT);
    let (status, _) = agent.call("GET", &stat, b"", true).await;
    assert_eq!(status, 200);

    let out = std::process::Command::new(env!("CARGO_BIN_EXE_silo-agent"))
        .args(["--listen", "unix:/nonexistent/agent.sock"])
        .args(["--key-file", "/proc/version", "--remove-key-file"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("cannot delete key file /proc/version"),
        "{stderr}"
    );
}

#[tokio::test]
async fn the_agent_lists_its_execs_with_what_they_run() {
    let agent = Agent::start("list", &[]);
    let mut ws = agent.ws().await;
    let running = exec(&mut ws, 1, argv(&["sleep", "30"])).await;
    let done = exec(&mut ws, 2, argv(&["true"])).await;
    until_exit(&mut ws, done).await;
    send(&mut ws, &ClientMessage::List { tag: 3 }).await;
    let execs = loop {
        if let In::Msg(AgentMessage::ExecList { tag: 3, execs }) = next(&mut ws).await {
            break execs;
        }
    };
    let found = |id| execs.iter().find(|e| e.exec_id == id).unwrap();
    let sleeping = found(running);
    assert_eq!(sleeping.argv, ["sleep", "30"]);
    assert_eq!(sleeping.state, ExecState::Running);
    assert!(sleeping.pid > 1 && !sleeping.tty && sleeping.session.is_none());
    assert!(!sleeping.cwd.is_empty());
    assert_eq!(found(done).state, ExecState::Finished);
}

#[tokio::test]
async fn an_attach_by_stream_offsets_resumes_each_stream_where_it_was() {
    let agent = Agent::start("streams", &[]);
    let mut ws = agent.ws().await;
    // out "ab" err "cde" out "f": combined "abcdef".
    let script = "printf ab; sleep 0.1; printf cde >&2; sleep 0.1; printf f";
    let id = exec(&mut ws, 1, argv(&["sh", "-c", script])).await;
    until_exit(&mut ws, id).await;
    // Has all of stdout's first run and one byte of stderr: the replay
    // starts at stderr's second byte, and says where each stream stands.
    send(
        &mut ws,
        &ClientMessage::Attach {
            tag: 2,
            exec_id: id,
            from_seq: 0,
            from_streams: Some(StreamOffsets {
                stdout: 2,
                stderr: 1,
            }),
        },
    )
    .await;
    match next(&mut ws).await {
        In::Msg(AgentMessage::Attached {
            next_seq,
            lost_bytes,
            streams,
            ..
        }) => {
            assert_eq!((next_seq, lost_bytes), (3, 0));
            assert_eq!(
                streams,
                Some(StreamOffsets {
                    stdout: 2,
                    stderr: 1
                })
            );
        }
        other => panic!("expected attached, got {other:?}"),
    }
    let mut seen = Vec::new();
    loop {
        match next(&mut ws).await {
            In::Out(frame) => seen.push((frame.channel, frame.payload)),
            In::Msg(AgentMessage::Exit { .. }) => break,
            _ => {}
        }
    }
    assert_eq!(
        seen,
        [
            (Channel::Stderr, b"de".to_vec()),
            (Channel::Stdout, b"f".to_vec())
        ]
    );
}

#[tokio::test]
async fn a_lifetime_deadline_stops_the_agent_and_can_be_cleared() {
    let mut agent = Agent::start("deadline", &[]);
    let read: DeadlineState = agent.json("GET", PATH_DEADLINE, b"").await;
    assert_eq!(read.remaining_ms, None);
    let set: DeadlineState = agent
        .json("PUT", PATH_DEADLINE, br#"{"seconds":3600}"#)
        .await;
    assert!(set.remaining_ms.is_some_and(|ms| ms > 3_590_000), "{set:?}");
    let cleared: DeadlineState = agent
        .json("PUT", PATH_DEADLINE, br#"{"seconds":null}"#)
        .await;
    assert_eq!(cleared.remaining_ms, None);
    let (status, _) = agent
        .call("PUT", PATH_DEADLINE, br#"{"seconds":"soon"}"#, true)
        .await;
    assert_eq!(status, 400, "a malformed deadline is refused");
    // A running command does not hold the sandbox past its deadline.
    let mut ws = agent.ws().await;
    exec(&mut ws, 1, argv(&["sleep", "100"])).await;
    let _: DeadlineState = agent.json("PUT", PATH_DEADLINE, br#"{"seconds":1}"#).await;
    let exited = agent.wait_exit(Duration::from_secs(20));
    assert_eq!(exited, Some(0), "the agent exits cleanly at its deadline");
}

#[tokio::test]
async fn a_watch_streams_a_directorys_changes_until_unwatched() {
    let agent = Agent::start("watch", &[]);
    std::fs::create_dir_all(agent.dir.join("watched/sub")).unwrap();
    let mut ws = agent.ws().await;
    send(
        &mut ws,
        &ClientMessage::Watch {
            tag: 1,
            path: "missing".into(),
            recursive: false,
        },
    )
    .await;
    match next(&mut ws).await {
        In::Msg(AgentMessage::Error {
            tag: Some(1), kind, ..
        }) => {
            assert_eq!(kind.to_string(), "not_found");
        }
        other => panic!("expected an error, got {other:?}"),
    }
    let watched = agent.dir.join("watched").display().to_string();
    send(
        &mut ws,
        &ClientMessage::Watch {
            tag: 2,
            path: watched,
            recursive: true,
        },
    )
    .await;
    let watch_id = match next(&mut ws).await {
        In::Msg(AgentMessage::Watching { tag: 2, watch_id }) => watch_id,
        other => panic!("expected watching, got {other:?}"),
    };
    std::fs::write(agent.dir.join("watched/sub/a.txt"), "a").unwrap();
    let mut names = Vec::new();
    while !names.contains(&"sub/a.txt".to_owned()) {
        match next(&mut ws).await {
            In::Msg(AgentMessage::FsEvents {
                watch_id: id,
                events,
            }) => {
                assert_eq!(id, watch_id);
                names.extend(events.into_iter().map(|e| e.name));
            }
            other => panic!("expected events, got {other:?}"),
        }
    }
    send(&mut ws, &ClientMessage::Unwatch { tag: 3, watch_id }).await;
    loop {
        match next(&mut ws).await {
            In::Msg(AgentMessage::Unwatched {
                tag: 3, existed, ..
            }) => {
                assert!(existed);
                break;
            }
            In::Msg(AgentMessage::FsEvents { .. }) => {}
            other => panic!("expected unwatched, got {other:?}"),
        }
    }
    // Nothing more arrives for it.
    std::fs::write(agent.dir.join("watched/b.txt"), "b").unwrap();
    let quiet = tokio::time::timeout(Duration::from_millis(300), ws.next()).await;
    assert!(
        quiet.is_err() || matches!(quiet, Ok(Some(Ok(Message::Ping(_))))),
        "{quiet:?}"
    );
}
