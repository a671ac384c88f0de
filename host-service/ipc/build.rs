//! Compiles `proto/**/*.proto` without a system `protoc`.
//!
//! 1. `protox` parses the `.proto` files into a `FileDescriptorSet`.
//! 2. `prost-build` turns it into Rust types (`OUT_DIR/perfetto.protos.rs`),
//!    with every `bytes` field as `bytes::Bytes` and a service generator that
//!    emits the RPC method tables and typed request enums.
//! 3. This script writes `OUT_DIR/schema.rs`: per message, its fields in
//!    declaration order and which of them are sub-messages. The canonical
//!    encoder uses it to reproduce the real Perfetto's bytes (Perfetto
//!    serializes fields in declaration order and sizes nested messages the
//!    protozero way).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use heck::{ToSnakeCase, ToUpperCamelCase};
use prost_types::field_descriptor_proto::Type;
use prost_types::{DescriptorProto, FileDescriptorSet};

/// The proto package every file uses (upstream's package, so that the real
/// Perfetto and `prost-reflect` users see the same names).
const PACKAGE: &str = "perfetto.protos";

/// `bytes` fields that hold a whole serialized message upstream declares as
/// a (non-lazy) sub-message. Their content is passed through verbatim, but
/// their length prefix is written the way Perfetto sizes nested messages.
const RAW_MESSAGE_FIELDS: &[(&str, u32)] = &[
    ("TraceConfig.DataSource", 1),
    ("GetAsyncCommandResponse.SetupDataSource", 2),
    ("GetAsyncCommandResponse.StartDataSource", 2),
    ("EnableTracingRequest", 1),
    ("ChangeTraceConfigRequest", 1),
    ("AttachResponse", 1),
    ("TracePacket", 33),
    ("DataSourceConfig", 101),
    ("DataSourceConfig", 115),
    ("DataSourceConfig", 119),
    ("DataSourceConfig", 1001),
];

fn main() {
    let proto_root = PathBuf::from("proto");
    println!("cargo:rerun-if-changed={}", proto_root.display());
    let mut files = Vec::new();
    collect_protos(&proto_root, &mut files);
    files.sort();
    for file in &files {
        println!("cargo:rerun-if-changed={}", file.display());
    }

    let fds = protox::compile(&files, [&proto_root]).unwrap_or_else(|e| {
        panic!("the .proto files under host-service/proto do not compile: {e}")
    });

    let out_dir = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    // The descriptors themselves, for run-time reflection (the CLI's
    // text-format configs and trace decoding use them through prost-reflect).
    std::fs::write(
        out_dir.join("file_descriptor_set.bin"),
        protox::prost::Message::encode_to_vec(&fds),
    )
    .expect("write OUT_DIR/file_descriptor_set.bin");
    let schema = SchemaGen::new(&fds).render();
    std::fs::write(out_dir.join("schema.rs"), schema).expect("write OUT_DIR/schema.rs");

    let mut config = prost_build::Config::new();
    config
        .bytes(["."])
        .service_generator(Box::new(PortGenerator))
        .out_dir(&out_dir);
    config
        .compile_fds(fds)
        .unwrap_or_else(|e| panic!("prost-build failed on host-service/proto: {e}"));
}

fn collect_protos(dir: &Path, out: &mut Vec<PathBuf>) {
    let entries =
        std::fs::read_dir(dir).unwrap_or_else(|e| panic!("cannot read {}: {e}", dir.display()));
    for entry in entries {
        let path = entry.expect("directory entry").path();
        if path.is_dir() {
            collect_protos(&path, out);
        } else if path.extension().is_some_and(|ext| ext == "proto") {
            out.push(path);
        }
    }
}

/// One message of the descriptor set, flattened.
struct Msg {
    /// Name relative to the package, e.g. `TraceConfig.DataSource`.
    name: String,
    /// Rust path relative to the generated module, e.g. `trace_config::DataSource`.
    rust_path: String,
    /// `(number, name, kind)` in declaration order.
    fields: Vec<(u32, String, FieldKind)>,
}

enum FieldKind {
    Scalar,
    Message(String),
    RawMessage,
}

struct SchemaGen {
    msgs: Vec<Msg>,
}

impl SchemaGen {
    fn new(fds: &FileDescriptorSet) -> Self {
        let mut msgs = Vec::new();
        for file in &fds.file {
            if file.package() != PACKAGE {
                continue;
            }
            for msg in &file.message_type {
                flatten(msg, "", "", &mut msgs);
            }
        }
        for &(msg, number) in RAW_MESSAGE_FIELDS {
            let field = msgs
                .iter_mut()
                .find(|m| m.name == msg)
                .and_then(|m| m.fields.iter_mut().find(|f| f.0 == number))
                .unwrap_or_else(|| panic!("RAW_MESSAGE_FIELDS: {msg}.{number} does not exist"));
            assert!(
                matches!(field.2, FieldKind::Scalar),
                "RAW_MESSAGE_FIELDS: {msg}.{number} must be declared `bytes`"
            );
            field.2 = FieldKind::RawMessage;
        }
        SchemaGen { msgs }
    }

    fn render(&self) -> String {
        let index: BTreeMap<&str, usize> = self
            .msgs
            .iter()
            .enumerate()
            .map(|(i, m)| (m.name.as_str(), i))
            .collect();
        let mut out =
            String::from("// @generated by host-service/build.rs from proto/**/*.proto.\n\n");
        for (i, msg) in self.msgs.iter().enumerate() {
            let mut fields = String::new();
            for (number, name, kind) in &msg.fields {
                let kind = match kind {
                    FieldKind::Scalar => "FieldKind::Scalar".to_owned(),
                    FieldKind::RawMessage => "FieldKind::RawMessage".to_owned(),
                    FieldKind::Message(ty) => {
                        let j = index
                            .get(ty.as_str())
                            .unwrap_or_else(|| panic!("{}: unknown message type {ty}", msg.name));
                        format!("FieldKind::Message(&M{j})")
                    }
                };
                let _ = write!(
                    fields,
                    "FieldSchema {{ number: {number}, name: \"{name}\", kind: {kind} }},"
                );
            }
            let mut by_number: Vec<(u32, usize)> = msg
                .fields
                .iter()
                .enumerate()
                .map(|(pos, f)| (f.0, pos))
                .collect();
            by_number.sort_unstable();
            let by_number: String = by_number
                .iter()
                .map(|(n, pos)| format!("({n}, {pos}),"))
                .collect();
            let _ = writeln!(
                out,
                "static M{i}: MessageSchema = MessageSchema {{ name: \"{PACKAGE}.{}\", \
                 fields: &[{fields}], by_number: &[{by_number}] }};",
                msg.name
            );
            let _ = writeln!(
                out,
                "impl ProtoSchema for super::{} {{ fn schema() -> &'static MessageSchema {{ &M{i} }} }}",
                msg.rust_path
            );
        }
        out
    }
}

fn flatten(msg: &DescriptorProto, parent_name: &str, parent_mod: &str, out: &mut Vec<Msg>) {
    let short = msg.name();
    let name = if parent_name.is_empty() {
        short.to_owned()
    } else {
        format!("{parent_name}.{short}")
    };
    let rust_path = format!("{parent_mod}{}", short.to_upper_camel_case());
    let fields = msg
        .field
        .iter()
        .map(|f| {
            let kind = match f.r#type() {
                Type::Message => {
                    let ty = f.type_name();
                    let rel = ty
                        .strip_prefix(&format!(".{PACKAGE}."))
                        .unwrap_or_else(|| panic!("{name}.{}: foreign type {ty}", f.name()));
                    FieldKind::Message(rel.to_owned())
                }
                Type::Group => panic!("{name}.{}: groups are not supported", f.name()),
                _ => FieldKind::Scalar,
            };
            (
                u32::try_from(f.number()).expect("field numbers are positive"),
                f.name().to_owned(),
                kind,
            )
        })
        .collect();
    out.push(Msg {
        name: name.clone(),
        rust_path,
        fields,
    });
    let child_mod = format!("{parent_mod}{}::", short.to_snake_case());
    for nested in &msg.nested_type {
        if nested.options.as_ref().is_some_and(|o| o.map_entry()) {
            panic!("{name}: map fields are not supported");
        }
        flatten(nested, &name, &child_mod, out);
    }
}

/// Emits, per proto service, a unit struct implementing
/// `crate::rpc::Service`, a module with one marker type per method
/// implementing `crate::rpc::Method`, and a `Request` enum of every
/// decoded request.
struct PortGenerator;

impl prost_build::ServiceGenerator for PortGenerator {
    fn generate(&mut self, service: prost_build::Service, buf: &mut String) {
        let ty = &service.name;
        let module = service.proto_name.to_snake_case();
        let proto_name = &service.proto_name;
        let rpc = "crate::rpc";

        let mut table = String::new();
        let mut variants = String::new();
        let mut decode_arms = String::new();
        let mut method_arms = String::new();
        let mut encode_arms = String::new();
        let mut markers = String::new();
        for (i, m) in service.methods.iter().enumerate() {
            assert!(
                !m.client_streaming,
                "{proto_name}.{}: client streaming is not part of the protocol",
                m.proto_name
            );
            let id = i + 1;
            let (name, input, output) = (&m.proto_name, &m.input_type, &m.output_type);
            let streaming = m.server_streaming;
            let _ = write!(
                table,
                "{rpc}::MethodDescriptor {{ id: {id}, name: \"{name}\", \
                 request_type: \"{}\", response_type: \"{}\", server_streaming: {streaming} }},",
                m.input_proto_type.trim_start_matches('.'),
                m.output_proto_type.trim_start_matches('.'),
            );
            let _ = write!(
                variants,
                "#[doc = \"`{proto_name}.{name}` (method id {id}).\"] {}(super::{input}),",
                m.name.to_upper_camel_case()
            );
            let _ = write!(
                decode_arms,
                "{id} => ::prost::Message::decode(args).map(Request::{}),",
                m.name.to_upper_camel_case()
            );
            let _ = write!(
                method_arms,
                "Request::{}(_) => &<super::{ty} as {rpc}::Service>::METHODS[{i}],",
                m.name.to_upper_camel_case()
            );
            let _ = write!(
                encode_arms,
                "Request::{}(m) => crate::protos::canonical::encode(m).into(),",
                m.name.to_upper_camel_case()
            );
            let _ = write!(
                markers,
                "#[doc = \"Marker for `{proto_name}.{name}`.\"] \
                 #[derive(Debug, Clone, Copy, PartialEq, Eq)] pub struct {marker}; \
                 impl {rpc}::Method for {marker} {{ \
                   type Service = super::{ty}; \
                   type Request = super::{input}; \
                   type Response = super::{output}; \
                   const ID: u32 = {id}; \
                   const NAME: &'static str = \"{name}\"; \
                   const SERVER_STREAMING: bool = {streaming}; \
                 }}",
                marker = m.name.to_upper_camel_case()
            );
        }

        let _ = write!(
            buf,
            "#[doc = \"The `{proto_name}` RPC service. Method ids are the 1-based declaration order.\"] \
             #[derive(Debug, Clone, Copy, PartialEq, Eq)] pub struct {ty}; \
             impl {rpc}::Service for {ty} {{ \
               const NAME: &'static str = \"{proto_name}\"; \
               const METHODS: &'static [{rpc}::MethodDescriptor] = &[{table}]; \
               type Request = {module}::Request; \
             }} \
             #[doc = \"Methods and decoded requests of `{proto_name}`.\"] \
             pub mod {module} {{ \
               #[doc = \"A decoded `{proto_name}` request.\"] \
               #[derive(Debug, Clone, PartialEq)] pub enum Request {{ {variants} }} \
               impl {rpc}::ServiceRequest for Request {{ \
                 fn decode(method_id: u32, args: ::bytes::Bytes) -> ::core::result::Result<Self, {rpc}::RequestDecodeError> {{ \
                   match method_id {{ {decode_arms} _ => return Err({rpc}::RequestDecodeError::UnknownMethod(method_id)), }} \
                     .map_err({rpc}::RequestDecodeError::Malformed) \
                 }} \
                 fn method(&self) -> &'static {rpc}::MethodDescriptor {{ match self {{ {method_arms} }} }} \
                 fn encode_args(&self) -> ::bytes::Bytes {{ match self {{ {encode_arms} }} }} \
               }} \
               {markers} \
             }}"
        );
        buf.push('\n');
    }
}
