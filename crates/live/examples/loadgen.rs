//! A lean streaming load generator for `servesim serve` (used by scripts/bench_live.py).
//!
//! N tasks each keep one streaming completion in flight for the whole run: a request goes out in
//! one write over a fresh connection (`Connection: close`, so the response ends at EOF), and the
//! task counts token chunks (`"finish_reason":null`) as they arrive, recording the time of each
//! read for TTFT and inter-chunk gaps. Tokens are counted only inside the measurement window.
//!
//! usage: loadgen ADDR STREAMS SECONDS PROMPT_TOKENS MAX_TOKENS [WARMUP_SECONDS]

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const PATTERN: &[u8] = b"\"finish_reason\":null";

fn count(hay: &[u8]) -> u64 {
    hay.windows(PATTERN.len()).filter(|w| *w == PATTERN).count() as u64
}

#[derive(Default)]
struct Stats {
    ttft_ms: Vec<f64>,
    gap_ms: Vec<f64>,
    requests: u64,
    errors: u64,
}

async fn one_stream(
    addr: String,
    seed: u64,
    prompt_tokens: usize,
    max_tokens: u32,
    tokens: Arc<AtomicU64>,
    counting: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
) -> Stats {
    let mut stats = Stats::default();
    let mut k = 0u64;
    let mut buf = vec![0u8; 64 * 1024];
    while !stop.load(Ordering::Relaxed) {
        k += 1;
        let prompt: Vec<String> =
            (0..prompt_tokens).map(|i| ((seed * 7919 + k * 104_729 + i as u64) % 30_000).to_string()).collect();
        let body = format!(r#"{{"prompt":[{}],"max_tokens":{max_tokens},"stream":true}}"#, prompt.join(","));
        let req = format!(
            "POST /v1/completions HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        let Ok(mut sock) = TcpStream::connect(&addr).await else {
            stats.errors += 1;
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let _ = sock.set_nodelay(true);
        let start = Instant::now();
        if sock.write_all(req.as_bytes()).await.is_err() {
            stats.errors += 1;
            continue;
        }
        let mut tail: Vec<u8> = Vec::new();
        let mut last: Option<Instant> = None;
        let mut seen = 0u64;
        loop {
            let n = match sock.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            let now = Instant::now();
            tail.extend_from_slice(&buf[..n]);
            let c = count(&tail);
            let keep = tail.len().saturating_sub(PATTERN.len() - 1);
            tail.drain(..keep);
            if c > 0 {
                match last {
                    None => stats.ttft_ms.push(now.duration_since(start).as_secs_f64() * 1000.0),
                    Some(prev) => stats.gap_ms.push(now.duration_since(prev).as_secs_f64() * 1000.0 / c as f64),
                }
                last = Some(now);
                seen += c;
                if counting.load(Ordering::Relaxed) {
                    tokens.fetch_add(c, Ordering::Relaxed);
                }
            }
        }
        if seen == max_tokens as u64 {
            stats.requests += 1;
        } else if !stop.load(Ordering::Relaxed) {
            stats.errors += 1;
        }
    }
    stats
}

fn pct(v: &mut [f64], q: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    v[((v.len() - 1) as f64 * q).round() as usize]
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.len() < 6 {
        eprintln!("usage: loadgen ADDR STREAMS SECONDS PROMPT_TOKENS MAX_TOKENS [WARMUP_SECONDS]");
        std::process::exit(2);
    }
    let addr = args[1].clone();
    let parse = |i: usize, what: &str| -> f64 {
        args[i].parse().unwrap_or_else(|_| {
            eprintln!("{what} must be a number");
            std::process::exit(2)
        })
    };
    let streams = parse(2, "STREAMS") as usize;
    let seconds = parse(3, "SECONDS");
    let prompt_tokens = parse(4, "PROMPT_TOKENS") as usize;
    let max_tokens = parse(5, "MAX_TOKENS") as u32;
    let warmup = if args.len() > 6 { parse(6, "WARMUP_SECONDS") } else { 2.0 };
    // One runtime thread: the client must not take the server's CPU.
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    rt.block_on(async move {
        let tokens = Arc::new(AtomicU64::new(0));
        let counting = Arc::new(AtomicBool::new(false));
        let stop = Arc::new(AtomicBool::new(false));
        let mut handles = Vec::new();
        for s in 0..streams {
            handles.push(tokio::spawn(one_stream(
                addr.clone(),
                s as u64,
                prompt_tokens,
                max_tokens,
                tokens.clone(),
                counting.clone(),
                stop.clone(),
            )));
        }
        tokio::time::sleep(Duration::from_secs_f64(warmup)).await;
        counting.store(true, Ordering::Relaxed);
        let t0 = Instant::now();
        tokio::time::sleep(Duration::from_secs_f64(seconds)).await;
        counting.store(false, Ordering::Relaxed);
        let window = t0.elapsed().as_secs_f64();
        let counted = tokens.load(Ordering::Relaxed);
        stop.store(true, Ordering::Relaxed);
        let mut all = Stats::default();
        for h in handles {
            // Streams in flight finish their current request.
            if let Ok(Ok(s)) = tokio::time::timeout(Duration::from_secs(120), h).await {
                all.ttft_ms.extend(s.ttft_ms);
                all.gap_ms.extend(s.gap_ms);
                all.requests += s.requests;
                all.errors += s.errors;
            }
        }
        println!(
            "{{\"streams\": {streams}, \"window_s\": {window:.3}, \"tokens\": {counted}, \"tokens_per_s\": {:.1}, \
             \"requests\": {}, \"errors\": {}, \"ttft_ms_p50\": {:.3}, \"ttft_ms_p99\": {:.3}, \"itl_ms_p50\": {:.3}, \
             \"itl_ms_p99\": {:.3}}}",
            counted as f64 / window,
            all.requests,
            all.errors,
            pct(&mut all.ttft_ms, 0.5),
            pct(&mut all.ttft_ms, 0.99),
            pct(&mut all.gap_ms, 0.5),
            pct(&mut all.gap_ms, 0.99),
        );
    });
}
