use outbox_core::{Delivery, outbox_handler};

#[outbox_handler]
async fn replicate(delivery: Delivery<String>) -> Result<(), std::io::Error> {
    let _ = delivery;
    Ok(())
}

fn main() {}
