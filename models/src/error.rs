//! Typed errors for model files and model inputs (MODEL-16).
//!
//! Every defect in a model file names the file and the field (or tensor) at
//! fault, so a user can find it without a hex editor. Header numbers are
//! checked against the file size before anything is allocated from them.

/// Result alias of the models crate.
pub type Result<T, E = ModelError> = std::result::Result<T, E>;

/// Every way a model file or a model input can be rejected.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum ModelError {
    #[error("{file}: cannot read: {message}")]
    Io { file: String, message: String },

    #[error("{file}: truncated while reading `{field}` at byte {offset}: needs {need} bytes, {have} remain")]
    Truncated { file: String, field: String, offset: u64, need: u64, have: u64 },

    #[error("{file}: bad magic {found:?}, expected {expected:?}")]
    BadMagic { file: String, found: String, expected: String },

    #[error("{file}: unsupported version {version} of `{field}`")]
    UnsupportedVersion { file: String, field: String, version: u64 },

    #[error("{file}: `{field}` = {value} is beyond what the file can hold ({limit})")]
    HeaderTooLarge { file: String, field: String, value: u64, limit: String },

    #[error("{file}: tensor `{tensor}` has unsupported type {dtype}")]
    UnsupportedTensorType { file: String, tensor: String, dtype: String },

    #[error("{file}: tensor `{tensor}` is missing")]
    MissingTensor { file: String, tensor: String },

    #[error("{file}: tensor `{tensor}` has shape {actual:?}, the config implies {expected:?}")]
    TensorShape { file: String, tensor: String, expected: Vec<usize>, actual: Vec<usize> },

    #[error("{file}: field `{field}` is missing")]
    MissingField { file: String, field: String },

    #[error("{file}: field `{field}`: {reason}")]
    InvalidField { file: String, field: String, reason: String },

    #[error("{file}: tokenizer: {message}")]
    Tokenizer { file: String, message: String },

    #[error("model input `{arg}`: {reason}")]
    InvalidInput { arg: &'static str, reason: String },
}

impl ModelError {
    /// A stable, language-neutral name of the variant (for reports and tests).
    pub fn kind(&self) -> &'static str {
        match self {
            ModelError::Io { .. } => "Io",
            ModelError::Truncated { .. } => "Truncated",
            ModelError::BadMagic { .. } => "BadMagic",
            ModelError::UnsupportedVersion { .. } => "UnsupportedVersion",
            ModelError::HeaderTooLarge { .. } => "HeaderTooLarge",
            ModelError::UnsupportedTensorType { .. } => "UnsupportedTensorType",
            ModelError::MissingTensor { .. } => "MissingTensor",
            ModelError::TensorShape { .. } => "TensorShape",
            ModelError::MissingField { .. } => "MissingField",
            ModelError::InvalidField { .. } => "InvalidField",
            ModelError::Tokenizer { .. } => "Tokenizer",
            ModelError::InvalidInput { .. } => "InvalidInput",
        }
    }

    pub(crate) fn invalid(file: &str, field: &str, reason: impl Into<String>) -> Self {
        ModelError::InvalidField { file: file.to_string(), field: field.to_string(), reason: reason.into() }
    }

    pub(crate) fn io(file: &std::path::Path, e: impl std::fmt::Display) -> Self {
        ModelError::Io { file: file.display().to_string(), message: e.to_string() }
    }
}
