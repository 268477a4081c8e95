//! The library's sandbox handle: `commands().spawn` keeps every byte across
//! connections cut under it, and says exactly how much it could not get
//! back; `files()` and `snapshots()` are the ones a harness holds.

#![allow(
    clippy::unwrap_used,
    reason = "a test should fail loudly at the first surprise"
)]

use sha2::{Digest, Sha256};
use silo::client::{AgentClient, Endpoint};
use silo::{CommandEvent, Commands};
use silo_protocol::exec::{Channel, ExecSpec};
use silo_tests::TestAgent;
use silo_tests::proxy::CuttingProxy;

/// One line the command repeats; the expected stream is built from it too.
const LINE: &str = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVW\n";

fn expected(len: usize) -> Vec<u8> {
    LINE.as_bytes().iter().copied().cycle().take(len).collect()
}

fn producer(len: usize) -> ExecSpec {
    ExecSpec::shell(&format!("yes '{}' | head -c {len}", LINE.trim_end()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spawn_delivers_every_byte_once_across_ten_cut_connections() {
    const TOTAL: usize = 50 << 20;
    // A ring that holds the whole output, so a cut can cost nothing.
    let agent = TestAgent::start_with(
        &["--ring-bytes", "67108864", "--output-budget", "134217728"],
        &[],
    )
    .await;
    let relay = CuttingProxy::start(&agent.dir.path().join("relay.sock"), &agent.socket());
    let commands = Commands::new(AgentClient::new(
        Endpoint::Unix(relay.path().to_path_buf()),
        agent.key.clone(),
    ));

    let mut execution = commands.spawn(producer(TOTAL)).await.unwrap();
    let mut hash = Sha256::new();
    let (mut received, mut cuts) = (0usize, 0);
    let exit = loop {
        match execution.next().await.unwrap().unwrap() {
            CommandEvent::Output {
                channel,
                offset,
                data,
            } => {
                assert_eq!(channel, Channel::Stdout);
                assert_eq!(offset, received as u64, "bytes arrive in order, once");
                received += data.len();
                hash.update(&data);
                if cuts < 10 && received >= (cuts + 1) * (TOTAL / 11) {
                    relay.cut();
                    cuts += 1;
                }
            }
            CommandEvent::Lost { bytes, .. } => {
                panic!("{bytes} bytes lost with a ring that held them")
            }
            CommandEvent::Exit(exit) => break exit,
        }
    };
    assert_eq!(cuts, 10);
    assert_eq!(exit.code, Some(0), "{exit:?}");
    assert_eq!(received, TOTAL);
    assert_eq!(
        hex(&hash.finalize()),
        hex(&Sha256::digest(expected(TOTAL))),
        "the bytes are the command's, in its order"
    );
    assert!(execution.next().await.unwrap().is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bytes_the_ring_no_longer_holds_are_counted_exactly() {
    const TOTAL: usize = 4 << 20;
    let agent = TestAgent::start_with(&["--ring-bytes", "65536"], &[]).await;
    let relay = CuttingProxy::start(&agent.dir.path().join("relay.sock"), &agent.socket());
    let commands = Commands::new(AgentClient::new(
        Endpoint::Unix(relay.path().to_path_buf()),
        agent.key.clone(),
    ));
    let mut execution = commands.spawn(producer(TOTAL)).await.unwrap();
    // Gone before the first byte is read; back only once the command is done.
    relay.cut();
    let id = execution.id();
    let direct = agent.client().connect().await.unwrap();
    while direct.status(id).await.unwrap().1.is_none() {
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }

    let all = expected(TOTAL);
    let (mut delivered, mut lost) = (0u64, 0u64);
    while let Some(event) = execution.next().await.unwrap() {
        match event {
            CommandEvent::Output { offset, data, .. } => {
                assert_eq!(offset, delivered + lost, "offsets count lost bytes");
                let at = usize::try_from(offset).unwrap();
                assert_eq!(&all[at..at + data.len()], data, "the bytes at {offset}");
                delivered += data.len() as u64;
            }
            CommandEvent::Lost { offset, bytes } => {
                assert_eq!(offset, delivered + lost);
                lost += bytes;
            }
            CommandEvent::Exit(exit) => assert_eq!(exit.code, Some(0)),
        }
    }
    assert!(lost > 0, "a 64 KiB ring cannot hold 4 MiB");
    assert_eq!(
        delivered + lost,
        TOTAL as u64,
        "every byte is delivered or counted"
    );
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn files_write_read_list_and_remove_through_the_handle() {
    let agent = TestAgent::start().await;
    let files = silo::Files::new(agent.client());
    let stat = files
        .write("dir/notes.txt", "hello\n", Some(0o600))
        .await
        .unwrap();
    assert_eq!(stat.size, 6);
    assert_eq!(stat.mode & 0o777, 0o600);
    assert_eq!(&files.read("dir/notes.txt").await.unwrap()[..], b"hello\n");
    let names: Vec<String> = files
        .list("dir")
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.name)
        .collect();
    assert_eq!(names, ["notes.txt"]);
    let err = files.read("dir/missing").await.unwrap_err();
    assert!(err.to_string().contains("dir/missing"), "{err}");
    assert!(!files.exists("dir/missing").await.unwrap());
    assert_eq!(files.remove("dir", true).await.unwrap(), 2);
    assert!(!files.exists("dir").await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_client_learns_how_a_command_ended_and_exactly_what_was_dropped() {
    // Finished output over its budget is dropped oldest first; the newest
    // finished command always keeps its own.
    let agent = TestAgent::start_with(&["--finished-output-budget", "65536"], &[]).await;
    let commands = Commands::new(agent.client());
    const EACH: usize = 200_000;
    let first = commands.spawn(producer(EACH)).await.unwrap();
    let first_id = first.id();
    let out = first.collect().await.unwrap();
    assert_eq!(out.stdout.len(), EACH);
    commands.run(producer(EACH)).await.unwrap();
    commands.run(producer(EACH)).await.unwrap();

    let late = commands
        .attach(first_id, 0)
        .await
        .unwrap()
        .collect()
        .await
        .unwrap();
    assert_eq!(late.exit.code, Some(0), "the record outlives its output");
    assert_eq!(late.exit.output_bytes, EACH as u64);
    assert_eq!(
        late.lost_bytes + late.stdout.len() as u64,
        EACH as u64,
        "what was dropped is counted exactly"
    );
    assert!(late.lost_bytes > 0, "the oldest output went first");
}
