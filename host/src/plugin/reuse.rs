//! Instances that answer more than one call. Instantiating afresh for every call is
//! about a third of a call's time; a plugin whose core module lets the host prove
//! what state it keeps is instead given back its initial state after each call, by a
//! function the host adds to the module at load and the component exports as
//! [`RESET_EXPORT`]. The function is host code (the plugin's own code cannot name it)
//! and restores everything a call of such a module can change:
//!
//! - linear memory: zeroed, then the module's data written again where instantiation
//!   writes it, over the whole initial memory; a call that grew the memory makes the
//!   reset trap, and the host drops that instance instead (memory cannot shrink);
//! - mutable globals: set to their initial values (the stack pointer among them).
//!
//! The host proves the rest before it rewrites anything, and otherwise leaves the
//! component as it is (each call then instantiates afresh, as before): one core module
//! with a memory, instantiated once, importing only functions, whose memory starts at
//! [`MAX_RESET_MEMORY`] at most, whose mutable globals start as `i32`/`i64` constants;
//! its other core modules (the adapters a component has for its imports) keep no
//! state at all: no memory, no mutable global, no data; no start function anywhere;
//! no instruction anywhere that changes a table or drops a segment (`table.set`,
//! `table.grow`, `table.fill`, `table.copy`, `table.init`, `elem.drop`, `data.drop`), so
//! tables and segments stay as instantiation left them; and no state in the component
//! itself: no canonical functions but lifts and lowers (resources keep handles there),
//! no imported or aliased core module, and nested components that hold or instantiate
//! no core module.

use std::ops::Range;

use wasm_encoder::{
    Alias, CanonicalFunctionSection, CanonicalOption, ComponentAliasSection, ComponentExportKind, ComponentExportSection,
    ComponentTypeSection, ComponentValType, Encode, ExportKind, Function, Instruction, RawSection,
};
use wasmparser::{BinaryReader, Operator, Parser, Payload, TypeRef, ValType};

/// The component function the host adds: restores the instance's initial state.
pub(crate) const RESET_EXPORT: &str = "plugdb-reset";

/// Initial memory a reset restores at most: each reset writes all of it.
pub(crate) const MAX_RESET_MEMORY: u64 = 1 << 20;

const PAGE: u64 = 1 << 16;

/// `component` with [`RESET_EXPORT`] added, or why its instances cannot be reused.
pub(crate) fn with_reset(component: &[u8]) -> Result<Vec<u8>, String> {
    let mut sections: Vec<(u8, Range<usize>)> = Vec::new();
    let (mut modules, mut core_instances): (Vec<Range<usize>>, u32) = (Vec::new(), 0);
    let mut instantiations: Vec<(u32, u32)> = Vec::new();
    let mut depth = 0usize;
    for payload in Parser::new(0).parse_all(component) {
        let payload = payload.map_err(|e| e.to_string())?;
        match &payload {
            Payload::Version { .. } if depth > 0 || !sections.is_empty() || !modules.is_empty() => depth += 1,
            Payload::End(_) if depth > 0 => {
                depth -= 1;
                continue;
            }
            _ => {}
        }
        // Canonical functions other than lifts and lowers (resources, tasks) keep
        // state in the component instance itself, which no reset reaches.
        if let Payload::ComponentCanonicalSection(reader) = &payload {
            for function in reader.clone() {
                match function.map_err(|e| e.to_string())? {
                    wasmparser::CanonicalFunction::Lift { .. } | wasmparser::CanonicalFunction::Lower { .. } => {}
                    _ => return Err("it uses canonical functions other than lifts and lowers (resources or tasks)".into()),
                }
            }
        }
        if depth > 0 {
            // Nested components (the type-ascribing shims of exports) are fine as long
            // as they hold no core code and instantiate none (not even an outer module).
            if matches!(payload, Payload::ModuleSection { .. } | Payload::InstanceSection(_)) {
                return Err("a nested component has or instantiates a core module".into());
            }
            continue;
        }
        match &payload {
            Payload::ModuleSection { unchecked_range, .. } => modules.push(unchecked_range.clone()),
            Payload::InstanceSection(reader) => {
                for instance in reader.clone() {
                    if let wasmparser::Instance::Instantiate { module_index, .. } = instance.map_err(|e| e.to_string())? {
                        instantiations.push((module_index, core_instances));
                    }
                    core_instances += 1;
                }
            }
            _ => {}
        }
        if let Some(section) = payload.as_section() {
            sections.push(section);
        }
    }
    let mut with_memory = None;
    for (index, range) in modules.iter().enumerate() {
        let found = CoreModule::read(&component[range.clone()])?;
        if found.memory_pages.is_none() {
            found.stateless()?;
        } else if with_memory.replace((index as u32, range.clone(), found)).is_some() {
            return Err("more than one core module has a memory".into());
        }
    }
    let (index, module, found) = with_memory.ok_or("no core module has a memory")?;
    let instances: Vec<u32> = instantiations.iter().filter(|(m, _)| *m == index).map(|(_, i)| *i).collect();
    let [instance] = instances[..] else {
        return Err(format!("its core module with a memory is instantiated {} times, not once", instances.len()));
    };
    let types = wasmparser::Validator::new().validate_all(component).map_err(|e| e.to_string())?;
    let types = types.as_ref();
    if types.module_count() as usize != modules.len() {
        return Err("it imports or aliases a core module".into());
    }
    let rewritten = found.with_reset(&component[module.clone()])?;

    let mut out = wasm_encoder::Component::new();
    for (id, range) in &sections {
        let data = if *range == module { &rewritten[..] } else { &component[range.clone()] };
        out.section(&RawSection { id: *id, data });
    }
    let mut aliases = ComponentAliasSection::new();
    aliases.alias(Alias::CoreInstanceExport { instance, kind: ExportKind::Func, name: RESET_EXPORT });
    out.section(&aliases);
    let mut func_types = ComponentTypeSection::new();
    func_types.function().params(std::iter::empty::<(&str, ComponentValType)>()).result(None);
    out.section(&func_types);
    let mut canon = CanonicalFunctionSection::new();
    canon.lift(types.function_count(), types.component_type_count(), std::iter::empty::<CanonicalOption>());
    out.section(&canon);
    let mut exports = ComponentExportSection::new();
    exports.export(RESET_EXPORT, ComponentExportKind::Func, types.component_function_count(), None);
    out.section(&exports);
    let out = out.finish();
    wasmparser::Validator::new().validate_all(&out).map_err(|e| format!("the component with a reset is not valid: {e}"))?;
    Ok(out)
}

/// What instantiation writes into memory: an active data segment.
struct Segment<'a> {
    offset: u32,
    data: &'a [u8],
}

/// What the host needs to know of a core module to reset its instance.
struct CoreModule<'a> {
    types: u32,
    imported_funcs: u32,
    /// Whether it imports a table (the only import besides functions it may have).
    imports_state: bool,
    defined_funcs: u32,
    memory_pages: Option<u64>,
    /// Each mutable global and the instruction that gives its initial value.
    globals: Vec<(u32, Instruction<'static>)>,
    /// Data segments, active or passive.
    data_segments: u32,
    /// The active ones.
    segments: Vec<Segment<'a>>,
}

fn err(e: wasmparser::BinaryReaderError) -> String {
    e.to_string()
}

impl<'a> CoreModule<'a> {
    /// Reads `module`; an error says why its instance cannot be reset.
    fn read(module: &'a [u8]) -> Result<Self, String> {
        let mut found = CoreModule {
            types: 0,
            imported_funcs: 0,
            imports_state: false,
            defined_funcs: 0,
            memory_pages: None,
            globals: Vec::new(),
            data_segments: 0,
            segments: Vec::new(),
        };
        let CoreModule { types, imported_funcs, imports_state, defined_funcs, memory_pages, globals, data_segments, segments } = &mut found;
        for payload in Parser::new(0).parse_all(module) {
            match payload.map_err(err)? {
                Payload::TypeSection(reader) => {
                    for group in reader {
                        let group = group.map_err(err)?;
                        if group.types().len() != 1 {
                            return Err("it declares recursive type groups".into());
                        }
                        *types += 1;
                    }
                }
                Payload::ImportSection(reader) => {
                    for import in reader.into_imports() {
                        match import.map_err(err)?.ty {
                            TypeRef::Func(_) | TypeRef::FuncExact(_) => *imported_funcs += 1,
                            TypeRef::Table(_) => *imports_state = true,
                            _ => return Err("a core module imports a memory, global or tag".into()),
                        }
                    }
                }
                Payload::FunctionSection(reader) => *defined_funcs = reader.count(),
                Payload::MemorySection(reader) => {
                    for memory in reader {
                        let memory = memory.map_err(err)?;
                        if memory_pages.is_some() || memory.memory64 || memory.shared || memory.page_size_log2.is_some() {
                            return Err("a core module has more than one memory, or one not of 32-bit addresses and 64 KiB pages".into());
                        }
                        *memory_pages = Some(memory.initial);
                    }
                }
                Payload::GlobalSection(reader) => {
                    for (index, global) in reader.into_iter().enumerate() {
                        let global = global.map_err(err)?;
                        if !global.ty.mutable {
                            continue;
                        }
                        let mut init = global.init_expr.get_operators_reader();
                        let value = match (global.ty.content_type, init.read().map_err(err)?, init.read().map_err(err)?) {
                            (ValType::I32, Operator::I32Const { value }, Operator::End) => Instruction::I32Const(value),
                            (ValType::I64, Operator::I64Const { value }, Operator::End) => Instruction::I64Const(value),
                            _ => return Err(format!("mutable global {index} does not start as an i32 or i64 constant")),
                        };
                        globals.push((index as u32, value));
                    }
                }
                Payload::StartSection { .. } => return Err("a core module has a start function".into()),
                Payload::DataSection(reader) => {
                    for data in reader {
                        let data = data.map_err(err)?;
                        *data_segments += 1;
                        if let wasmparser::DataKind::Active { memory_index, offset_expr } = data.kind {
                            let mut offset = offset_expr.get_operators_reader();
                            match (memory_index, offset.read().map_err(err)?, offset.read().map_err(err)?) {
                                (0, Operator::I32Const { value }, Operator::End) => {
                                    segments.push(Segment { offset: value as u32, data: data.data })
                                }
                                _ => return Err("a data segment's offset is not a constant".into()),
                            }
                        }
                    }
                }
                Payload::CodeSectionEntry(body) => {
                    let mut ops = body.get_operators_reader().map_err(err)?;
                    while !ops.eof() {
                        let changes_a_table_or_segment = matches!(
                            ops.read().map_err(err)?,
                            Operator::TableSet { .. }
                                | Operator::TableGrow { .. }
                                | Operator::TableFill { .. }
                                | Operator::TableCopy { .. }
                                | Operator::TableInit { .. }
                                | Operator::ElemDrop { .. }
                                | Operator::DataDrop { .. }
                        );
                        if changes_a_table_or_segment {
                            return Err("its code changes a table or drops a segment".into());
                        }
                    }
                }
                _ => {}
            }
        }
        Ok(found)
    }

    /// Whether an instance of this module keeps no state of its own after instantiation.
    fn stateless(&self) -> Result<(), String> {
        if self.globals.is_empty() && self.data_segments == 0 && self.memory_pages.is_none() {
            Ok(())
        } else {
            Err("a core module without a memory keeps state (a mutable global or data)".into())
        }
    }

    /// `module` (which `self` was read from) with the reset function added and
    /// exported as [`RESET_EXPORT`], or why not.
    fn with_reset(&self, module: &[u8]) -> Result<Vec<u8>, String> {
        let CoreModule { types, imported_funcs, imports_state, defined_funcs, memory_pages, globals, data_segments, segments } = self;
        let (types, imported_funcs, defined_funcs, data_segments) = (*types, *imported_funcs, *defined_funcs, *data_segments);
        if *imports_state {
            return Err("its core module with a memory imports a table".into());
        }
        let pages = memory_pages.ok_or("it defines no memory")?;
        let memory_bytes = pages * PAGE;
        if memory_bytes > MAX_RESET_MEMORY {
            return Err(format!("its initial memory is {} KiB, above {} KiB", memory_bytes >> 10, MAX_RESET_MEMORY >> 10));
        }
        if segments.iter().any(|s| u64::from(s.offset) + s.data.len() as u64 > memory_bytes) {
            return Err("a data segment lies beyond the initial memory".into());
        }

        // The reset: trap if the memory grew; zero what no segment covers; write every
        // segment again, in order, from a passive copy of it; set the mutable globals.
        let mut reset = Function::new([]);
        reset
            .instruction(&Instruction::MemorySize(0))
            .instruction(&Instruction::I32Const(pages as i32))
            .instruction(&Instruction::I32Ne)
            .instruction(&Instruction::If(wasm_encoder::BlockType::Empty))
            .instruction(&Instruction::Unreachable)
            .instruction(&Instruction::End);
        for gap in uncovered(segments, memory_bytes) {
            reset
                .instruction(&Instruction::I32Const(gap.start as i32))
                .instruction(&Instruction::I32Const(0))
                .instruction(&Instruction::I32Const((gap.end - gap.start) as i32))
                .instruction(&Instruction::MemoryFill(0));
        }
        for (i, segment) in segments.iter().enumerate() {
            reset
                .instruction(&Instruction::I32Const(segment.offset as i32))
                .instruction(&Instruction::I32Const(0))
                .instruction(&Instruction::I32Const(segment.data.len() as i32))
                .instruction(&Instruction::MemoryInit { mem: 0, data_index: data_segments + i as u32 });
        }
        for (index, value) in globals {
            reset.instruction(value).instruction(&Instruction::GlobalSet(*index));
        }
        reset.instruction(&Instruction::End);
        let reset_index = imported_funcs + defined_funcs;
        let data_count = data_segments + segments.len() as u32;

        let data_count_section = encoded(&data_count);
        let mut out = wasm_encoder::Module::new();
        let mut wrote_data_count = false;
        for payload in Parser::new(0).parse_all(module) {
            let payload = payload.map_err(err)?;
            let Some((id, range)) = payload.as_section() else { continue };
            let body = &module[range];
            let replaced = match id {
                1 => appended(body, &[0x60, 0, 0])?,
                3 => appended(body, &encoded(&types))?,
                7 => {
                    let mut export = Vec::new();
                    RESET_EXPORT.encode(&mut export);
                    export.push(0x00);
                    reset_index.encode(&mut export);
                    appended(body, &export)?
                }
                10 => {
                    if !wrote_data_count {
                        out.section(&RawSection { id: 12, data: &data_count_section });
                        wrote_data_count = true;
                    }
                    appended(body, &encoded(&reset))?
                }
                11 => {
                    let mut copies = Vec::new();
                    for segment in segments {
                        copies.push(0x01);
                        segment.data.encode(&mut copies);
                    }
                    appended_n(body, segments.len() as u32, &copies)?
                }
                12 => {
                    wrote_data_count = true;
                    data_count_section.clone()
                }
                _ => body.to_vec(),
            };
            out.section(&RawSection { id, data: &replaced });
        }
        if !wrote_data_count {
            return Err("it has no code".into());
        }
        Ok(out.finish())
    }
}

fn encoded(value: &impl Encode) -> Vec<u8> {
    let mut bytes = Vec::new();
    value.encode(&mut bytes);
    bytes
}

/// A vector section's `body` with one more item, `item`.
fn appended(body: &[u8], item: &[u8]) -> Result<Vec<u8>, String> {
    appended_n(body, 1, item)
}

/// A vector section's `body` with `n` more items, `items`.
fn appended_n(body: &[u8], n: u32, items: &[u8]) -> Result<Vec<u8>, String> {
    let mut reader = BinaryReader::new(body, 0);
    let count = reader.read_var_u32().map_err(|e| e.to_string())?;
    let mut out = Vec::with_capacity(body.len() + items.len() + 5);
    (count + n).encode(&mut out);
    out.extend_from_slice(&body[reader.original_position()..]);
    out.extend_from_slice(items);
    Ok(out)
}

/// The ranges of `0..size` no segment writes.
fn uncovered(segments: &[Segment<'_>], size: u64) -> Vec<Range<u64>> {
    let mut covered: Vec<Range<u64>> =
        segments.iter().map(|s| u64::from(s.offset)..u64::from(s.offset) + s.data.len() as u64).filter(|r| !r.is_empty()).collect();
    covered.sort_by_key(|r| r.start);
    let (mut gaps, mut at) = (Vec::new(), 0);
    for range in covered {
        if range.start > at {
            gaps.push(at..range.start);
        }
        at = at.max(range.end);
    }
    if at < size {
        gaps.push(at..size);
    }
    gaps
}

#[cfg(test)]
mod tests {
    use super::*;
    use wasm_encoder::{
        CodeSection, ConstExpr, DataSection, ExportSection, FunctionSection, GlobalSection, GlobalType, MemArg, MemorySection, MemoryType,
        Module, StartSection, TypeSection, ValType,
    };

    const HELLO_AT: i32 = 1024;
    const GAP_AT: i32 = 40_000;

    /// A module with a mutable global (7) and "hello" at [`HELLO_AT`], exporting `poke`
    /// (bumps the global, writes over "h" and into a byte no segment covers, answers
    /// global × 1000 + the byte at `HELLO_AT`), `peek(address)`, `grow` and, when
    /// `extra` is given, a function of that body.
    fn module(pages: u64, extra: Option<&[Instruction<'_>]>, start: bool) -> Vec<u8> {
        let mut types = TypeSection::new();
        types.ty().function([], [ValType::I32]);
        types.ty().function([ValType::I32], [ValType::I32]);
        types.ty().function([], []);
        let mut functions = FunctionSection::new();
        functions.function(0).function(1).function(2).function(2);
        let mut memory = MemorySection::new();
        memory.memory(MemoryType { minimum: pages, maximum: None, memory64: false, shared: false, page_size_log2: None });
        let mut globals = GlobalSection::new();
        globals.global(GlobalType { val_type: ValType::I32, mutable: true, shared: false }, &ConstExpr::i32_const(7));
        let mut exports = ExportSection::new();
        exports.export("poke", ExportKind::Func, 0).export("peek", ExportKind::Func, 1).export("grow", ExportKind::Func, 2);
        let byte = MemArg { offset: 0, align: 0, memory_index: 0 };
        let mut poke = Function::new([]);
        for i in [
            Instruction::GlobalGet(0),
            Instruction::I32Const(1),
            Instruction::I32Add,
            Instruction::GlobalSet(0),
            Instruction::I32Const(HELLO_AT),
            Instruction::I32Const(HELLO_AT),
            Instruction::I32Load8U(byte),
            Instruction::I32Const(1),
            Instruction::I32Add,
            Instruction::I32Store8(byte),
            Instruction::I32Const(GAP_AT),
            Instruction::I32Const(9),
            Instruction::I32Store8(byte),
            Instruction::GlobalGet(0),
            Instruction::I32Const(1000),
            Instruction::I32Mul,
            Instruction::I32Const(HELLO_AT),
            Instruction::I32Load8U(byte),
            Instruction::I32Add,
            Instruction::End,
        ] {
            poke.instruction(&i);
        }
        let mut peek = Function::new([]);
        peek.instruction(&Instruction::LocalGet(0)).instruction(&Instruction::I32Load8U(byte)).instruction(&Instruction::End);
        let mut grow = Function::new([]);
        grow.instruction(&Instruction::I32Const(1)).instruction(&Instruction::MemoryGrow(0)).instruction(&Instruction::Drop);
        grow.instruction(&Instruction::End);
        let mut other = Function::new([]);
        for i in extra.unwrap_or_default() {
            other.instruction(i);
        }
        other.instruction(&Instruction::End);
        let mut code = CodeSection::new();
        code.function(&poke).function(&peek).function(&grow).function(&other);
        let mut data = DataSection::new();
        data.active(0, &ConstExpr::i32_const(HELLO_AT), b"hello".iter().copied());

        let mut module = Module::new();
        module.section(&types).section(&functions);
        if extra.is_some() {
            let mut tables = wasm_encoder::TableSection::new();
            tables.table(wasm_encoder::TableType {
                element_type: wasm_encoder::RefType::FUNCREF,
                table64: false,
                minimum: 1,
                maximum: None,
                shared: false,
            });
            module.section(&tables);
        }
        module.section(&memory).section(&globals).section(&exports);
        if start {
            module.section(&StartSection { function_index: 3 });
        }
        module.section(&code).section(&data);
        module.finish()
    }

    fn reset_module(bytes: &[u8]) -> Result<Vec<u8>, String> {
        CoreModule::read(bytes)?.with_reset(bytes)
    }

    struct Running {
        store: wasmtime::Store<()>,
        instance: wasmtime::Instance,
    }

    impl Running {
        fn new(bytes: &[u8]) -> Self {
            let engine = wasmtime::Engine::default();
            let module = wasmtime::Module::new(&engine, bytes).expect("the rewritten module compiles");
            let mut store = wasmtime::Store::new(&engine, ());
            let instance = wasmtime::Instance::new(&mut store, &module, &[]).expect("instantiates");
            Self { store, instance }
        }

        fn poke(&mut self) -> i32 {
            let f = self.instance.get_typed_func::<(), i32>(&mut self.store, "poke").expect("poke");
            f.call(&mut self.store, ()).expect("poke runs")
        }

        fn peek(&mut self, at: i32) -> i32 {
            let f = self.instance.get_typed_func::<i32, i32>(&mut self.store, "peek").expect("peek");
            f.call(&mut self.store, at).expect("peek runs")
        }

        fn call(&mut self, name: &str) -> wasmtime::Result<()> {
            let f = self.instance.get_typed_func::<(), ()>(&mut self.store, name)?;
            f.call(&mut self.store, ())
        }
    }

    #[test]
    fn the_reset_gives_memory_and_globals_back_their_initial_state() {
        let mut running = Running::new(&reset_module(&module(1, None, false)).expect("reusable"));
        let first = running.poke();
        assert_eq!(first, 8000 + i32::from(b'i'));
        assert_eq!(running.poke(), 9000 + i32::from(b'j'), "without a reset the state carries over");
        running.call(RESET_EXPORT).expect("the reset runs");
        assert_eq!((running.peek(GAP_AT), running.peek(HELLO_AT)), (0, i32::from(b'h')));
        assert_eq!(running.poke(), first, "after a reset a call sees what a fresh instance sees");
        running.call(RESET_EXPORT).expect("the reset runs");
        running.call("grow").expect("grows");
        let trapped = running.call(RESET_EXPORT).expect_err("a grown memory cannot be reset");
        assert_eq!(trapped.downcast_ref::<wasmtime::Trap>(), Some(&wasmtime::Trap::UnreachableCodeReached));
    }

    #[test]
    fn what_the_host_cannot_reset_keeps_fresh_instances() {
        let refused = |bytes: Vec<u8>| reset_module(&bytes).expect_err("not reusable");
        let set = [Instruction::I32Const(0), Instruction::RefNull(wasm_encoder::HeapType::FUNC), Instruction::TableSet(0)];
        assert!(refused(module(1, Some(&set), false)).contains("changes a table"));
        assert!(refused(module(1, None, true)).contains("start function"));
        assert!(refused(module(17, None, false)).contains("initial memory is 1088 KiB"));
        reset_module(&module(16, Some(&[Instruction::Nop]), false)).expect("a table nothing changes is fine");
    }

    /// A component around [`module`], with a resource whose handles `resource.new` makes
    /// when `resources` is set.
    fn component(resources: bool) -> Vec<u8> {
        let module = module(1, None, false);
        let mut component = wasm_encoder::Component::new();
        component.section(&RawSection { id: 1, data: &module });
        let mut instances = wasm_encoder::InstanceSection::new();
        instances.instantiate(0, std::iter::empty::<(&str, wasm_encoder::ModuleArg)>());
        component.section(&instances);
        if resources {
            let mut types = ComponentTypeSection::new();
            types.resource(ValType::I32, None);
            component.section(&types);
            let mut canon = CanonicalFunctionSection::new();
            canon.resource_new(0);
            component.section(&canon);
        }
        component.finish()
    }

    #[test]
    fn a_component_gets_its_reset_unless_it_keeps_state_in_the_component_itself() {
        let with = with_reset(&component(false)).expect("reusable");
        let types = wasmparser::Validator::new().validate_all(&with).expect("valid");
        assert!(types.as_ref().component_item_for_export(RESET_EXPORT).is_some(), "the reset is exported");
        let refused = with_reset(&component(true)).expect_err("a resource's handles outlive a call");
        assert!(refused.contains("canonical functions other than lifts and lowers"), "{refused}");
    }

    #[test]
    fn gaps_are_what_no_segment_covers() {
        let segment = |offset: u32, len: usize| Segment { offset, data: &[0; 64][..len] };
        let segments = [segment(10, 5), segment(0, 2), segment(12, 10), segment(30, 0)];
        assert_eq!(uncovered(&segments, 40), vec![2..10, 22..40]);
        assert_eq!(uncovered(&[], 8), vec![0..8]);
    }
}
